"""What every attention block shares: the keyword arguments and their check, the input
checks, the decode-state rules, splitting heads and zeroing padded queries.

A subclass sets `name` and `patterns`, takes its own keyword arguments with defaults
(the ones of configs/attention/<name>.yaml), extends `check_arguments` (a ValueError
naming the argument; the config layer, lavo_tasks.attention.check_attention_config, runs
the same check naming the config keys) and implements

    _whole(x, source, key_mask) -> y [B, T, D]       the whole sequence (training)
    _step(x, state) -> (y [B, t, D], state)          t positions after those `state` saw
    _self_state(batch_size) -> state                 CS: the state before position 0
    _cross_state(context, context_mask) -> state     CC, NC: the source, read once

Decode states are values: NamedTuples of batch-first tensors (and plain ints), never
changed in place, so that lavo_tasks.generation.reorder can follow a beam.
"""

import inspect
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..kernels.backend import BACKENDS

PATTERN_NAMES = {
    "CS": "causal self-attention",
    "NS": "noncausal self-attention",
    "CC": "causal cross-attention",
    "NC": "noncausal cross-attention",
}


def pattern_of(causal: bool, cross: bool) -> str:
    return ("C" if causal else "N") + ("C" if cross else "S")


def argument_name(argument: str) -> str:
    """How a block's check names an argument by default: by itself (`rank`, `n_heads`)."""
    return argument


# What the checks call to name an argument in a message: argument_name, or the config
# layer's key of it (`attention.rank`, `model.n_heads`).
Namer = Callable[[str], str]


class AttentionBlock(nn.Module):
    """Base class of the blocks (the interface: the package docstring)."""

    name: str = ""
    patterns: frozenset[str] = frozenset()

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, **options):
        """options: the subclass's own keyword arguments, checked here by check_arguments
        (ValueError naming the argument)."""
        super().__init__()
        unknown = sorted(set(options) - set(self.option_names()))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown argument {unknown[0]!r}; "
                            f"its own are: {', '.join(self.option_names()) or 'none'}")
        self.pattern = pattern_of(causal, cross)
        self.check_arguments(options, d_model, n_heads, self.pattern)
        self.causal, self.cross = causal, cross
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The block's own keyword arguments: its config keys besides `name`."""
        return tuple(cls.option_defaults())

    @classmethod
    def option_defaults(cls) -> dict:
        """The block's own keyword arguments and their defaults."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return {p.name: p.default for p in parameters
                if p.kind is p.KEYWORD_ONLY and p.name not in ("causal", "cross")}

    @classmethod
    def check_arguments(cls, options: Mapping, d_model: int, n_heads: int, pattern: str, *,
                        name: Namer = argument_name) -> None:
        """Raise ValueError naming the first bad argument (`name(argument)`: the argument
        itself, or the config layer's key for it) with its value and what is allowed, or
        naming the pattern if the block cannot run it. `options`: the block's own keyword
        arguments (any mapping with `.get`). Subclasses extend it."""
        if pattern not in cls.patterns:
            supported = ", ".join(f"{p} ({PATTERN_NAMES[p]})" for p in sorted(cls.patterns))
            raise ValueError(
                f"attention {cls.name!r} does not support {PATTERN_NAMES[pattern]} "
                f"({pattern}); it supports: {supported}"
            )
        if not is_int(d_model) or d_model < 1:
            raise ValueError(f"{name('d_model')}={d_model!r}: must be an integer >= 1")
        if not is_int(n_heads) or n_heads < 1 or d_model % n_heads:
            raise ValueError(f"{name('n_heads')}={n_heads!r}: must be >= 1 and divide {name('d_model')}={d_model}")

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


def check_count(argument: str, value, name: Namer = argument_name) -> None:
    """`argument` must be an integer >= 1 (a window, slots, segments)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name(argument)}={value!r}: must be an integer >= 1")


def check_backend(value, name: Namer = argument_name) -> None:
    """`backend` of the attentions with kernels (lavo, gsa)."""
    if value not in BACKENDS:
        raise ValueError(f"{name('backend')}={value!r}: allowed {', '.join(BACKENDS)}")


def check_window(window, pattern: str, name: Namer = argument_name) -> None:
    """`window` of the windowed attentions (local, lavo): an integer >= 1, and even in
    noncausal self-attention, whose queries see |t - j| <= window / 2."""
    check_count("window", window, name)
    if pattern == "NS" and window % 2:
        raise ValueError(
            f"{name('window')}={window}: must be even for noncausal self-attention (NS), "
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
