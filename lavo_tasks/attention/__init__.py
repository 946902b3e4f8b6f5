"""Attention blocks chosen by name: `softmax`, `local`, `lavo`, `gsa`.

Every block has the same interface (docs/design.md §1):

    block = LavoAttention(d_model, 4, causal=True, cross=False, window=64)
    block = build_attention({"name": "lavo", "window": 64}, d_model, 4, causal=True, cross=False)
    y, state = block(x, context=None, mask=None, context_mask=None, state=None)

- x [B, T, D]; context [B, S, D] for cross-attention, None for self-attention.
- mask [B, T] / context_mask [B, S]: bool, True marks a real position. In
  self-attention `mask` marks both the padded keys and the padded queries (output 0).
- state=None: the whole sequence at once (training); the returned state is None.
- Decoding: `state = block.init_state(batch_size, context=..., context_mask=...)`, then
  each call `block(x_new, context=..., state=state)` with x_new [B, t, D] (the t >= 1
  positions that follow those already seen) returns their outputs and the new state.
  softmax keeps a KV cache, local a ring buffer, lavo and gsa constant-size states.
  A state is a value (NamedTuples of batch-first tensors, never changed in place).

A block built from keyword arguments raises ValueError naming the bad argument
(`rank=99: ...`), or the attention and the pattern it cannot run. This module is also
the config layer: `build_attention` and `check_attention_config` take a site's
attention config (any mapping: `name` and the block's keyword arguments) and raise
ConfigError naming the config key instead (`attention.rank=99: ...`, `model.n_heads`).

The block classes (`SoftmaxAttention`, `LocalAttention`, `LavoAttention`,
`GatedSlotAttention`) are importable from here; each is imported on first use, so that a
block's dependencies (Triton, for instance) load only when that block is used.
"""

import importlib
from collections.abc import Callable, Mapping

from ..errors import ConfigError
from .base import PATTERN_NAMES, AttentionBlock, pattern_of

# name -> "module:Class"
_BLOCKS = {
    "softmax": "lavo_tasks.attention.softmax:SoftmaxAttention",
    "local": "lavo_tasks.attention.local:LocalAttention",
    "lavo": "lavo_tasks.attention.lavo:LavoAttention",
    "gsa": "lavo_tasks.attention.gsa:GatedSlotAttention",
}
_CLASS_NAMES = {path.split(":")[1]: name for name, path in _BLOCKS.items()}

ATTENTION_NAMES = tuple(_BLOCKS)
# The block arguments that are model keys in a run's config; the others are the site's own.
MODEL_ARGUMENTS = ("d_model", "n_heads")


def block_class(name: str) -> type[AttentionBlock]:
    if name not in _BLOCKS:
        raise ConfigError(f"attention.name={name!r}: unknown attention; allowed: {', '.join(_BLOCKS)}")
    module_name, class_name = _BLOCKS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def __getattr__(attribute: str):
    """The block classes by their class names, imported on first use."""
    if attribute in _CLASS_NAMES:
        return block_class(_CLASS_NAMES[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def config_key(argument: str) -> str:
    """The config key of a block's argument: `model.d_model`, `model.n_heads`, else the
    site's own `attention.<argument>`."""
    return f"model.{argument}" if argument in MODEL_ARGUMENTS else f"attention.{argument}"


def _block_options(cfg: Mapping) -> tuple[type[AttentionBlock], dict]:
    """The block class that `cfg["name"]` names and its keyword arguments from `cfg` (a
    key left out takes its default); ConfigError for a missing name or an unknown key."""
    if "name" not in cfg:
        raise ConfigError(f"attention.name: missing; allowed: {', '.join(_BLOCKS)}")
    cls = block_class(cfg["name"])
    options = {key: value for key, value in cfg.items() if key != "name"}
    unknown = sorted(set(options) - set(cls.option_names()))
    if unknown:
        allowed = ", ".join(cls.option_names()) or "none besides name"
        raise ConfigError(f"attention.{unknown[0]}: not a key of attention {cfg['name']!r}; allowed: {allowed}")
    return cls, {**cls.option_defaults(), **options}


def check_attention_config(cfg: Mapping, d_model: int, n_heads: int, pattern: str) -> None:
    """Raise ConfigError naming the config key (`attention.<key>`, `model.n_heads`) for a
    bad value of one site's attention config, or naming the pattern if the attention cannot
    run it: the blocks' own check, in the config's words. The config validation calls
    this for every attention site of a task before any work."""
    cls, options = _block_options(cfg)
    try:
        cls.check_arguments(options, d_model, n_heads, pattern, name=config_key)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build_attention(cfg: Mapping, d_model: int, n_heads: int, *, causal: bool, cross: bool) -> AttentionBlock:
    """Build the block named `cfg["name"]` for one attention site of a model: the other
    keys of `cfg` (a dict or a DictConfig) are the block's keyword arguments (a key left
    out takes its default). A bad value raises ConfigError naming the key."""
    check_attention_config(cfg, d_model, n_heads, pattern_of(causal, cross))
    cls, options = _block_options(cfg)
    return cls(d_model, n_heads, causal=causal, cross=cross, **options)


# What a layer or stack takes for one attention site: a site's config (a mapping, built by
# build_attention), or a block class or any callable taking (d_model, n_heads, *, causal,
# cross), such as functools.partial(LavoAttention, rank=8).
AttentionSpec = Mapping | Callable[..., AttentionBlock]


def make_attention(spec: AttentionSpec, d_model: int, n_heads: int, *, causal: bool, cross: bool) -> AttentionBlock:
    """The block of one attention site from `spec` (AttentionSpec): a mapping's errors name
    its keys (ConfigError), a class's name its arguments (ValueError)."""
    if isinstance(spec, Mapping):
        return build_attention(spec, d_model, n_heads, causal=causal, cross=cross)
    if not callable(spec):
        raise TypeError(f"attention: expected a block class (or a callable that builds one) or a mapping with a name, "
                        f"got {type(spec).__name__}")
    block = spec(d_model, n_heads, causal=causal, cross=cross)
    if not isinstance(block, AttentionBlock):
        raise TypeError(f"attention: {spec!r} built a {type(block).__name__}, not an attention block")
    return block


__all__ = [
    "ATTENTION_NAMES", "AttentionBlock", "AttentionSpec", "GatedSlotAttention", "LavoAttention", "LocalAttention",
    "PATTERN_NAMES", "SoftmaxAttention", "block_class", "build_attention", "check_attention_config", "config_key",
    "make_attention", "pattern_of",
]
