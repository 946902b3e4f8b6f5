"""What every attention block shares: the pattern check and the config check."""

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
    """Base class of the blocks; subclasses set `name` and `patterns` and implement
    `check_config`, `init_state(batch_size, context=None, context_mask=None)` and
    `forward(x, context=None, mask=None, context_mask=None, state=None) -> (y, state)`
    (see the package docstring)."""

    name: str = ""
    patterns: frozenset[str] = frozenset()

    def __init__(self, cfg: DictConfig, d_model: int, *, n_heads: int, causal: bool, cross: bool):
        super().__init__()
        self.pattern = pattern_of(causal, cross)
        self.check_config(cfg, d_model, n_heads, self.pattern)
        self.causal, self.cross = causal, cross
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads

    @classmethod
    def check_config(cls, cfg: DictConfig, d_model: int, n_heads: int, pattern: str) -> None:
        """Raise ConfigError naming `attention.<key>` for a bad value, or the pattern if
        the block cannot run it. The config validation calls this for every attention
        site of a task before any work; subclasses extend it."""
        if pattern not in cls.patterns:
            supported = ", ".join(f"{p} ({PATTERN_NAMES[p]})" for p in sorted(cls.patterns))
            raise ConfigError(
                f"attention {cls.name!r} does not support {PATTERN_NAMES[pattern]} "
                f"({pattern}); it supports: {supported}"
            )
        if n_heads < 1 or d_model % n_heads:
            raise ConfigError(f"model.n_heads={n_heads}: must be >= 1 and divide model.d_model={d_model}")


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
