"""`softmax`: exact multi-head attention through torch SDPA, every pattern, KV-cache decode.

Queries and keys get rotary positions (rope.py) in self-attention only: a source and a
target have no common position axis. Causal cross-attention (CC) lets target position t
see source positions j <= min(t, m-1), so a target longer than the source sees all of it.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from .base import AttentionBlock, check_mask
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


@dataclass
class KVCache:
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

    def __init__(self, cfg: DictConfig, d_model: int, *, n_heads: int, causal: bool, cross: bool):
        super().__init__(cfg, d_model, n_heads=n_heads, causal=causal, cross=cross)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.n_heads, self.head_dim)  # [B, T, D] -> [B, T, H, d]

    def _queries(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        q = self._split_heads(self.q_proj(x))
        if not self.cross:
            q = apply_rope(q, offset)
        return q.transpose(1, 2)  # [B, H, T, d]

    def _keys_values(self, source: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = (self._split_heads(t) for t in self.kv_proj(source).chunk(2, dim=-1))
        if not self.cross:
            k = apply_rope(k, offset)
        return k.transpose(1, 2), v.transpose(1, 2)  # [B, H, S, d] each

    def _attend(self, q, k, v, key_mask):
        """The whole-sequence attention (training); `local` restricts it to a window."""
        return attend(q, k, v, causal=self.causal, key_mask=key_mask)

    def forward(self, x, context=None, mask=None, context_mask=None, state=None):
        if self.cross != (context is not None) and state is None:
            need = "a context [B, S, D]" if self.cross else "no context"
            raise ValueError(f"attention {self.name!r} ({self.pattern}) needs {need}")
        check_mask(mask, x, "mask")
        if state is not None:
            if mask is not None:
                raise ValueError(f"attention {self.name!r}: decoding takes real positions only (mask must be None)")
            o, state = self._decode(x, state)
        else:
            source, key_mask = (context, context_mask) if self.cross else (x, mask)
            check_mask(context_mask, source, "context_mask")
            q = self._queries(x, 0)
            k, v = self._keys_values(source, 0)
            o = self._attend(q, k, v, key_mask)
        y = self.out_proj(o.transpose(1, 2).reshape(x.shape))  # [B, H, T, d] -> [B, T, D]
        if mask is not None:
            y = y * mask[..., None]  # padded queries output 0
        return y, state

    def _decode_pattern_check(self) -> None:
        if self.pattern == "NS":
            raise ValueError(
                f"attention {self.name!r}: noncausal self-attention (NS) cannot be decoded step by step"
            )

    def init_state(self, batch_size: int, context=None, context_mask=None) -> KVCache:
        self._decode_pattern_check()
        if self.cross:
            if context is None:
                raise ValueError(f"attention {self.name!r} ({self.pattern}): init_state needs the context")
            check_mask(context_mask, context, "context_mask")
            k, v = self._keys_values(context, 0)
            return KVCache(k, v, context_mask, 0)
        weight = self.q_proj.weight
        empty = weight.new_zeros(batch_size, self.n_heads, 0, self.head_dim)
        return KVCache(empty, empty, None, 0)

    def _decode(self, x, state: KVCache):
        q = self._queries(x, state.position)
        # Casts: under autocast the cache may have been made in another dtype than q.
        k, v = state.k.to(q.dtype), state.v.to(q.dtype)
        if not self.cross:
            k_new, v_new = self._keys_values(x, state.position)
            k, v = torch.cat([k, k_new.to(q.dtype)], dim=2), torch.cat([v, v_new.to(q.dtype)], dim=2)
        o = attend(q, k, v, causal=self.causal, offset=state.position, key_mask=state.key_mask)
        return o, KVCache(k, v, state.key_mask, state.position + x.shape[1])
