"""`softmax`: exact multi-head attention through torch SDPA, every pattern, KV-cache decode.

Queries and keys get rotary positions (rope.py) in self-attention only: a source and a
target have no common position axis. Causal cross-attention (CC) lets target position t
see source positions j <= min(t, m-1), so a target longer than the source sees all of it.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionBlock
from .rope import apply_rope


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """SDPA where `allowed` (bool, True = the query may see the key, broadcastable to the
    score shape [..., T, S]) may leave a query with no key at all: such a query outputs 0
    (SDPA alone would give NaN). q [..., T, d], k and v [..., S, d] -> [..., T, d]."""
    has_key = allowed.any(dim=-1, keepdim=True)  # [..., T, 1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key)
    return out * has_key


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, offset: int = 0, key_mask=None
) -> torch.Tensor:
    """Softmax attention of q [B, H, T, d] over k, v [B, H, S, d]; the queries sit at
    positions offset .. offset+T-1. Query p sees key j when key_mask[b, j] (bool [B, S],
    True = real; None = all real) and, if causal, j <= p (which for causal cross is the
    design's j <= min(p, S-1): there is no key past S-1)."""
    T, S = q.shape[2], k.shape[2]
    if key_mask is None and not causal:
        return F.scaled_dot_product_attention(q, k, v)
    if key_mask is None and offset == 0 and T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = torch.ones(1, 1, 1, S, dtype=torch.bool, device=q.device)
    if causal:
        # j <= p; a query past the source's end (p >= S, causal cross) thus sees all of it.
        positions = torch.arange(offset, offset + T, device=q.device)
        allowed = allowed & (torch.arange(S, device=q.device)[None, :] <= positions[:, None])  # [1, 1, T, S]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]  # [B, 1, T or 1, S]
    return masked_attention(q, k, v, allowed)


class KVCache(NamedTuple):
    """Decode state of `softmax`. Self-attention: the keys (rotated at their positions)
    and values of every position seen so far. Cross-attention: the projected source,
    fixed for the whole decode, and its padding mask."""

    k: torch.Tensor  # [B, H, S, d]
    v: torch.Tensor  # [B, H, S, d]
    key_mask: torch.Tensor | None  # [B, S] (cross-attention) or None
    position: int  # how many target positions came before the next call


class SoftmaxAttention(AttentionBlock):
    """Exact attention; the `local` block extends it with a window."""

    name = "softmax"
    patterns = frozenset({"CS", "NS", "CC", "NC"})

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, **options):
        """options: the keys of a block built on this one (local's window)."""
        super().__init__(d_model, n_heads, causal=causal, cross=cross, **options)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _queries(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        q = self.split_heads(self.q_proj(x))
        if not self.cross:
            q = apply_rope(q, offset)
        return q.transpose(1, 2)  # [B, H, T, d]

    def _keys_values(self, source: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = (self.split_heads(t) for t in self.kv_proj(source).chunk(2, dim=-1))
        if not self.cross:
            k = apply_rope(k, offset)
        return k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, d] each

    def _output(self, o: torch.Tensor) -> torch.Tensor:
        return self.out_proj(o.transpose(1, 2).flatten(2))  # [B, H, T, d] -> [B, T, D]

    def _attend(self, q, k, v, key_mask):
        """The whole-sequence attention (training); `local` restricts it to a window."""
        return attend(q, k, v, causal=self.causal, key_mask=key_mask)

    def _whole(self, x, source, key_mask):
        return self._output(self._attend(self._queries(x, 0), *self._keys_values(source, 0), key_mask))

    def _self_state(self, batch_size: int) -> KVCache:
        empty = self.q_proj.weight.new_zeros(batch_size, self.n_heads, 0, self.head_dim)
        return KVCache(empty, empty, None, 0)

    def _cross_state(self, context, context_mask) -> KVCache:
        k, v = self._keys_values(context, 0)
        return KVCache(k, v, context_mask, 0)

    def _step(self, x, state: KVCache):
        q = self._queries(x, state.position)
        # Casts: under autocast the cache may have been made in another dtype than q.
        k, v = state.k.to(q.dtype), state.v.to(q.dtype)
        if not self.cross:
            k_new, v_new = self._keys_values(x, state.position)
            k, v = torch.cat([k, k_new.to(q.dtype)], dim=2), torch.cat([v, v_new.to(q.dtype)], dim=2)
        o = attend(q, k, v, causal=self.causal, offset=state.position, key_mask=state.key_mask)
        return self._output(o), KVCache(k, v, state.key_mask, state.position + x.shape[1])
