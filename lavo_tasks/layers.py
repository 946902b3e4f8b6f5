"""Pre-norm Transformer layers; each attention site is an AttentionSpec (a block class or
factory, or a site's config: lavo_tasks.attention.make_attention).

    x = x + attention(LayerNorm(x))          (self-attention)
    x = x + cross_attention(LayerNorm(x))    (decoder with a memory only)
    x = x + FeedForward(LayerNorm(x))

Dropout applies to each residual branch. Padding: where `mask` (bool [B, T], True = a
real position) marks padding, a layer's output is set to 0, so padded positions carry
no information from layer to layer (the attention blocks already never read padded
keys; the zeros make the padded outputs a fixed value rather than a function of
whatever the padding held).
"""

from typing import NamedTuple

import torch
from torch import nn

from .attention import AttentionSpec, make_attention
from .attention.base import is_int


def check_feed_forward(d_ff, dropout) -> None:
    """ValueError naming `d_ff` (an integer >= 1) or `dropout` (a number in [0, 1))."""
    if not is_int(d_ff) or d_ff < 1:
        raise ValueError(f"d_ff={d_ff!r}: must be an integer >= 1")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout={dropout!r}: must be a number in [0, 1)")


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        check_feed_forward(d_ff, dropout)
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def zero_padding(x: torch.Tensor, mask) -> torch.Tensor:
    """x [B, T, D] with the positions where mask [B, T] is False set to 0 (mask None: x)."""
    return x if mask is None else x * mask[..., None]


class TransformerEncoderLayer(nn.Module):
    """Self-attention (noncausal unless `causal`) and a feed-forward, pre-norm."""

    def __init__(self, d_model: int, n_heads: int, attention: AttentionSpec, *, d_ff: int, dropout: float = 0.0,
                 causal: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = make_attention(attention, d_model, n_heads, causal=causal, cross=False)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """x [B, T, D], mask [B, T] bool or None -> [B, T, D]."""
        x = x + self.drop(self.attn(self.norm1(x), mask=mask)[0])
        x = x + self.ff(self.norm2(x))
        return zero_padding(x, mask)


class DecoderState(NamedTuple):
    """Decode state of a decoder layer: its blocks' states (cross is None without one)."""

    self_attn: object
    cross_attn: object


class TransformerDecoderLayer(nn.Module):
    """Self-attention (causal unless `causal=False`), optional cross-attention over a
    memory (causal cross, CC, when `cross_causal`; noncausal, NC, otherwise), and a
    feed-forward, pre-norm. A decoder-only model passes cross_attention=None."""

    def __init__(self, d_model: int, n_heads: int, self_attention: AttentionSpec,
                 cross_attention: AttentionSpec | None = None, *, d_ff: int, dropout: float = 0.0, causal: bool = True,
                 cross_causal: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = make_attention(self_attention, d_model, n_heads, causal=causal, cross=False)
        self.cross_attn = None
        if cross_attention is not None:
            self.norm_cross = nn.LayerNorm(d_model)
            self.cross_attn = make_attention(cross_attention, d_model, n_heads, causal=cross_causal, cross=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def _check_memory(self, memory) -> None:
        if (memory is None) != (self.cross_attn is None):
            need = "a memory [B, S, D]" if self.cross_attn is not None else "no memory (it has no cross-attention)"
            raise ValueError(f"TransformerDecoderLayer: needs {need}")

    def init_state(self, batch_size: int, memory=None, memory_mask=None) -> DecoderState:
        """The state before the first decoded position; the memory is read here, once."""
        self._check_memory(memory)
        cross = None
        if self.cross_attn is not None:
            cross = self.cross_attn.init_state(batch_size, context=memory, context_mask=memory_mask)
        return DecoderState(self.self_attn.init_state(batch_size), cross)

    def forward(self, x: torch.Tensor, memory=None, mask=None, memory_mask=None, state: DecoderState = None):
        """x [B, T, D]; memory [B, S, D]; mask [B, T], memory_mask [B, S] bool or None.
        state=None: the whole sequence (returns state None). Otherwise x holds the positions
        following those already decoded (mask must be None; the memory was taken at
        init_state, memory here is ignored) and the new state is returned."""
        if state is None:
            self._check_memory(memory)
        self_state, cross_state = state if state is not None else (None, None)
        h, self_state = self.self_attn(self.norm1(x), mask=mask, state=self_state)
        x = x + self.drop(h)
        if self.cross_attn is not None:
            h, cross_state = self.cross_attn(self.norm_cross(x), context=memory, mask=mask, context_mask=memory_mask,
                                             state=cross_state)
            x = x + self.drop(h)
        x = x + self.ff(self.norm2(x))
        return zero_padding(x, mask), (None if state is None else DecoderState(self_state, cross_state))
