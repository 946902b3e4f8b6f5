"""Attention blocks chosen by name: `softmax`, `local`, `lavo`, `gsa`.

Every block has the same interface (docs/design.md §1):

    block = build_attention(cfg, d_model, n_heads=4, causal=True, cross=False)
    block = LavoAttention(d_model, 4, causal=True, cross=False, window=64)  # lavo_tasks.attention.lavo
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

A block that cannot run a pattern raises ConfigError at construction, naming the
attention and the pattern.
"""

import importlib

from omegaconf import DictConfig

from ..errors import ConfigError
from .base import PATTERN_NAMES, AttentionBlock, pattern_of

# name -> "module:Class"; imported on first use so that a block's dependencies
# (Triton, for instance) load only when that block is built.
_BLOCKS = {
    "softmax": "lavo_tasks.attention.softmax:SoftmaxAttention",
    "local": "lavo_tasks.attention.local:LocalAttention",
    "lavo": "lavo_tasks.attention.lavo:LavoAttention",
    "gsa": "lavo_tasks.attention.gsa:GatedSlotAttention",
}

ATTENTION_NAMES = tuple(_BLOCKS)


def block_class(name: str) -> type[AttentionBlock]:
    if name not in _BLOCKS:
        raise ConfigError(f"attention.name={name!r}: unknown attention; allowed: {', '.join(_BLOCKS)}")
    module_name, class_name = _BLOCKS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_attention(cfg: DictConfig, d_model: int, *, n_heads: int, causal: bool, cross: bool) -> AttentionBlock:
    """Build the block named `cfg.name` for one attention site of a model: the config's
    other keys are the block's keyword arguments (a key left out takes its default)."""
    cls = block_class(cfg.name)
    options = {key: value for key, value in cfg.items() if key != "name"}
    unknown = sorted(set(options) - set(cls.option_names()))
    if unknown:
        allowed = ", ".join(cls.option_names()) or "none besides name"
        raise ConfigError(f"attention.{unknown[0]}: not a key of attention {cfg.name!r}; allowed: {allowed}")
    return cls(d_model, n_heads, causal=causal, cross=cross, **options)


__all__ = ["ATTENTION_NAMES", "AttentionBlock", "PATTERN_NAMES", "block_class", "build_attention", "pattern_of"]
