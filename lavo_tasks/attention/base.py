"""What every attention block shares: the keyword arguments and their check, the input
checks, the decode-state rules, splitting heads and zeroing padded queries.

A subclass sets `name` and `patterns`, takes its own keys as keyword arguments with
defaults (the ones of configs/attention/<name>.yaml; the config validation calls its
`check_config` on a site's config before any model is built) and implements

    _whole(x, source, key_mask) -> y [B, T, D]       the whole sequence (training)
    _step(x, state) -> (y [B, t, D], state)          t positions after those `state` saw
    _self_state(batch_size) -> state                 CS: the state before position 0
    _cross_state(context, context_mask) -> state     CC, NC: the source, read once

Decode states are values: NamedTuples of batch-first tensors (and plain ints), never
changed in place, so that lavo_tasks.generation.reorder can follow a beam.
"""

import inspect

import torch
from omegaconf import DictConfig
from torch import nn

from ..errors import ConfigError
from ..kernels.backend import BACKENDS

PATTERN_NAMES = {
    "CS": "causal self-attention",
    "NS": "noncausal self-attention",
    "CC": "causal cross-attention",
    "NC": "noncausal cross-attention",
}


def pattern_of(causal: bool, cross: bool) -> str:
    return ("C" if causal else "N") + ("C" if cross else "S")


class AttentionBlock(nn.Module):
    """Base class of the blocks (the interface: the package docstring)."""

    name: str = ""
    patterns: frozenset[str] = frozenset()

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, **options):
        """options: the subclass's own keyword arguments, checked here by check_config."""
        super().__init__()
        unknown = sorted(set(options) - set(self.option_names()))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown argument {unknown[0]!r}; "
                            f"its own are: {', '.join(self.option_names()) or 'none'}")
        self.pattern = pattern_of(causal, cross)
        self.check_config(options, d_model, n_heads, self.pattern)
        self.causal, self.cross = causal, cross
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The block's own keyword arguments: its config keys besides `name`."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in ("causal", "cross"))

    @classmethod
    def check_config(cls, cfg: DictConfig, d_model: int, n_heads: int, pattern: str) -> None:
        """Raise ConfigError naming `attention.<key>` for a bad value, or the pattern if
        the block cannot run it. The config validation calls this for every attention
        site of a task before any work; subclasses extend it. `cfg` is anything with
        `.get` (a DictConfig, or the keyword arguments as a dict)."""
        if pattern not in cls.patterns:
            supported = ", ".join(f"{p} ({PATTERN_NAMES[p]})" for p in sorted(cls.patterns))
            raise ConfigError(
                f"attention {cls.name!r} does not support {PATTERN_NAMES[pattern]} "
                f"({pattern}); it supports: {supported}"
            )
        if n_heads < 1 or d_model % n_heads:
            raise ConfigError(f"model.n_heads={n_heads}: must be >= 1 and divide model.d_model={d_model}")

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.n_heads, self.head_dim)  # [B, T, D] -> [B, T, H, d]

    def forward(self, x, context=None, mask=None, context_mask=None, state=None):
        """x [B, T, D]; context [B, S, D] (cross-attention) or None; mask [B, T] and
        context_mask [B, S] bool (True = real) or None; state None (the whole sequence) or
        a decode state (x: the positions after those it saw; context and context_mask
        were read at init_state and are ignored). -> (y [B, T, D], new state or None)."""
        check_mask(mask, x, "mask")
        if state is None:
            if self.cross != (context is not None):
                need = "a context [B, S, D]" if self.cross else "no context"
                raise ValueError(f"attention {self.name!r} ({self.pattern}) needs {need}")
            source, key_mask = (context, context_mask) if self.cross else (x, mask)
            if self.cross:
                check_mask(context_mask, context, "context_mask")
            y = self._whole(x, source, key_mask)
        else:
            if mask is not None:
                raise ValueError(f"attention {self.name!r}: decoding takes real positions only (mask must be None)")
            y, state = self._step(x, state)
        if mask is not None:
            y = y * mask[..., None]  # padded queries output 0
        return y, state

    def init_state(self, batch_size: int, context=None, context_mask=None):
        """The decode state before the first target position; cross-attention reads the
        context [B, S, D] (and context_mask [B, S]) here, once."""
        if self.pattern == "NS":
            raise ValueError(f"attention {self.name!r}: noncausal self-attention (NS) cannot be decoded step by step")
        if not self.cross:
            return self._self_state(batch_size)
        if context is None:
            raise ValueError(f"attention {self.name!r} ({self.pattern}): init_state needs the context")
        check_mask(context_mask, context, "context_mask")
        return self._cross_state(context, context_mask)


def is_int(value) -> bool:
    """An int and not a bool (YAML's true/false would pass isinstance(value, int))."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(key: str, value) -> None:
    """`attention.<key>` must be an integer >= 1 (a window, slots, segments)."""
    if not is_int(value) or value < 1:
        raise ConfigError(f"attention.{key}={value!r}: must be an integer >= 1")


def check_backend(value) -> None:
    """`attention.backend` of the attentions with kernels (lavo, gsa)."""
    if value not in BACKENDS:
        raise ConfigError(f"attention.backend={value!r}: allowed {', '.join(BACKENDS)}")


def check_window(window, pattern: str) -> None:
    """`attention.window` of the windowed attentions (local, lavo): an integer >= 1, and
    even in noncausal self-attention, whose queries see |t - j| <= window / 2."""
    check_count("window", window)
    if pattern == "NS" and window % 2:
        raise ConfigError(
            f"attention.window={window}: must be even for noncausal self-attention (NS), "
            "whose queries see |t - j| <= window / 2"
        )


def check_mask(mask, x: torch.Tensor, key: str) -> None:
    """A mask must be bool [B, T] matching x [B, T, ...]; `key` names the argument."""
    if mask is None:
        return
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"{key}: expected a bool tensor of shape {tuple(x.shape[:2])} (True = a real position), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
