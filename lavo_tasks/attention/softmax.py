"""`softmax`: exact multi-head attention through torch SDPA, every pattern, KV-cache decode.

Queries and keys get rotary positions (rope.py) in self-attention only: a source and a
target have no common position axis. Causal cross-attention (CC) lets target position t
see source positions j <= min(t, m-1), so a target longer than the source sees all of it.

`alibi: true` adds ALiBi's linear distance penalty to the self-attention scores (CS, NS;
cross-attention has no common position axis and ignores it): head h of H (h = 1..H)
adds -m_h |t - j| to the logit of query t and key j, with the geometric slopes
m_h = 2 ** (-8 h / H) (ALiBi's for a power-of-two H; the same formula for any H). Rotary
positions stay; the penalty is a prior towards nearby keys that every head can outweigh
through its scores, so a head with a small slope still reads the whole sequence. The
scores then go to SDPA as a float mask, O(T S) memory per head (no FlashAttention).
"""

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionBlock, Namer, argument_name
from .rope import apply_rope


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA where `allowed` (bool, True = the query may see the key, broadcastable to the
    score shape [..., T, S]) may leave a query with no key at all: such a query outputs 0
    (SDPA alone would give NaN). bias: None, or a float tensor broadcastable to the score
    shape added to the allowed scores. q [..., T, d], k and v [..., S, d] -> [..., T, d]."""
    has_key = allowed.any(dim=-1, keepdim=True)  # [..., T, 1]
    mask = allowed | ~has_key  # bool; a keyless query sees every key, and is zeroed below
    if bias is not None:  # as a float mask: the bias where allowed, -inf elsewhere
        mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out * has_key


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's slope of each head [H]: 2 ** (-8 h / H) for h = 1..H."""
    return 2.0 ** (-8.0 * torch.arange(1, n_heads + 1, dtype=torch.float32) / n_heads)


def alibi_bias(slopes: torch.Tensor, n_queries: int, n_keys: int, offset: int = 0) -> torch.Tensor:
    """-slope_h * |p - j| for query positions p = offset .. offset+n_queries-1 and key
    positions j = 0 .. n_keys-1: [H, T, S] float32 (the causal mask, applied beside it,
    removes j > p)."""
    positions = offset + torch.arange(n_queries, device=slopes.device)  # offset: an int or a 0-dim tensor
    distance = (positions[:, None] - torch.arange(n_keys, device=slopes.device)[None, :]).abs()
    return -slopes[:, None, None] * distance[None].float()


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, offset: int = 0, key_mask=None, bias=None
) -> torch.Tensor:
    """Softmax attention of q [B, H, T, d] over k, v [B, H, S, d]; the queries sit at
    positions offset .. offset+T-1. Query p sees key j when key_mask[b, j] (bool [B, S],
    True = real; None = all real) and, if causal, j <= p (which for causal cross is the
    design's j <= min(p, S-1): there is no key past S-1). bias: None or a float [H, T, S]
    added to the scores (ALiBi). `offset` may be a 0-dim tensor on the device (a captured
    decode step): nothing here then reads it back to the host."""
    T, S = q.shape[2], k.shape[2]
    if bias is None and key_mask is None and not causal:
        return F.scaled_dot_product_attention(q, k, v)
    if bias is None and key_mask is None and isinstance(offset, int) and offset == 0 and T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    allowed = torch.ones(1, 1, 1, S, dtype=torch.bool, device=q.device)
    if causal:
        # j <= p; a query past the source's end (p >= S, causal cross) thus sees all of it.
        positions = offset + torch.arange(T, device=q.device)  # offset: an int or a 0-dim tensor
        allowed = allowed & (torch.arange(S, device=q.device)[None, :] <= positions[:, None])  # [1, 1, T, S]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]  # [B, 1, T or 1, S]
    return masked_attention(q, k, v, allowed, bias)


class KVCache(NamedTuple):
    """Decode state of `softmax`. Self-attention: the keys (rotated at their positions)
    and values of every position seen so far. Cross-attention: the projected source,
    fixed for the whole decode, and its padding mask."""

    k: torch.Tensor  # [B, H, S, d]
    v: torch.Tensor  # [B, H, S, d]
    key_mask: torch.Tensor | None  # [B, S] (cross-attention) or None
    position: int  # how many target positions came before the next call
    cross: bool = False  # the source of cross-attention (it never grows)

    def with_room(self, room: int):
        """The same state in buffers of fixed size that take `room` more positions: a
        `StaticKVCache` for self-attention; cross-attention's source is already fixed."""
        if self.cross:
            return self
        batch, heads, seen, dim = self.k.shape
        k, v = (self.k.new_zeros(batch, heads, seen + room, dim) for _ in range(2))
        k[:, :, :seen], v[:, :, :seen] = self.k, self.v
        return StaticKVCache(k, v, self.position)


class StaticKVCache(NamedTuple):
    """The self-attention KV cache of a captured decode (gpt-fast's static cache):
    buffers of the generation's whole length, of which positions 0 .. position-1 are
    filled. The one state that a step changes in place (it writes the new positions into
    the buffers and returns them): the generation loop owns it and never reuses an old
    one, and a CUDA graph needs the same buffers at every replay."""

    k: torch.Tensor  # [B, H, capacity, d]
    v: torch.Tensor  # [B, H, capacity, d]
    position: int | torch.Tensor  # filled positions: an int, or a 0-dim long tensor on the device

    IN_PLACE = True  # for lavo_tasks.generation: a step writes into k and v (beam search reorders them)

    def with_room(self, room: int):
        """This cache, if it has room for `room` more positions; else ValueError (a
        generation longer than the cache was made for). Reads a position on the device
        once (before a decode, never inside one)."""
        capacity, filled = self.k.shape[2], int(self.position)
        if filled + room > capacity:
            raise ValueError(f"the static KV cache has room for {capacity - filled} more positions "
                             f"({filled} of {capacity} filled), {room} asked")
        return self


class SoftmaxAttention(AttentionBlock):
    """Exact attention; the `local` block extends it with a window (and has no `alibi`)."""

    name = "softmax"
    patterns = frozenset({"CS", "NS", "CC", "NC"})

    @classmethod
    def check_arguments(cls, options: Mapping, d_model: int, n_heads: int, pattern: str, *,
                        name: Namer = argument_name) -> None:
        super().check_arguments(options, d_model, n_heads, pattern, name=name)
        if "alibi" in cls.option_names() and not isinstance(options.get("alibi"), bool):
            raise ValueError(f"{name('alibi')}={options.get('alibi')!r}: must be true or false")

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, alibi: bool = False, **options):
        """options: the keys of a block built on this one (local's window)."""
        if "alibi" in self.option_names():
            options["alibi"] = alibi
        super().__init__(d_model, n_heads, causal=causal, cross=cross, **options)
        # The slopes are a fixed buffer (not saved: a function of n_heads), None where unused.
        self.alibi = bool(alibi) and not cross
        self.register_buffer("slopes", alibi_slopes(n_heads) if self.alibi else None, persistent=False)
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

    def _bias(self, n_queries: int, n_keys: int, offset: int):
        """The ALiBi scores [H, T, S] of self-attention with `alibi`, else None."""
        return alibi_bias(self.slopes, n_queries, n_keys, offset) if self.alibi else None

    def _attend(self, q, k, v, key_mask):
        """The whole-sequence attention (training); `local` restricts it to a window."""
        bias = self._bias(q.shape[2], k.shape[2], 0)
        return attend(q, k, v, causal=self.causal, key_mask=key_mask, bias=bias)

    def _whole(self, x, source, key_mask):
        return self._output(self._attend(self._queries(x, 0), *self._keys_values(source, 0), key_mask))

    def _self_state(self, batch_size: int) -> KVCache:
        empty = self.q_proj.weight.new_zeros(batch_size, self.n_heads, 0, self.head_dim)
        return KVCache(empty, empty, None, 0)

    def _cross_state(self, context, context_mask) -> KVCache:
        k, v = self._keys_values(context, 0)
        return KVCache(k, v, context_mask, 0, cross=True)

    def _step(self, x, state: KVCache | StaticKVCache):
        if isinstance(state, StaticKVCache):
            return self._static_step(x, state)
        q = self._queries(x, state.position)
        # Casts: under autocast the cache may have been made in another dtype than q.
        k, v = state.k.to(q.dtype), state.v.to(q.dtype)
        if not self.cross:
            k_new, v_new = self._keys_values(x, state.position)
            k, v = torch.cat([k, k_new.to(q.dtype)], dim=2), torch.cat([v, v_new.to(q.dtype)], dim=2)
        o = attend(q, k, v, causal=self.causal, offset=state.position, key_mask=state.key_mask,
                   bias=self._bias(q.shape[2], k.shape[2], state.position))
        return self._output(o), KVCache(k, v, state.key_mask, state.position + x.shape[1], state.cross)

    def _static_step(self, x, state: StaticKVCache):
        """The step over a static cache: the t new positions are written into its buffers
        (in place; a position past the capacity is an error of the caller's `room`), and
        the queries see the filled positions up to their own."""
        t, capacity = x.shape[1], state.k.shape[2]
        if not isinstance(state.position, torch.Tensor):  # a device position: checked before the decode
            state.with_room(t)
        q = self._queries(x, state.position)
        k_new, v_new = self._keys_values(x, state.position)
        positions = state.position + torch.arange(t, device=x.device)  # [t]
        state.k.index_copy_(2, positions, k_new.to(state.k.dtype))
        state.v.index_copy_(2, positions, v_new.to(state.v.dtype))
        allowed = torch.arange(capacity, device=x.device)[None, :] <= positions[:, None]  # [t, capacity]
        k, v = state.k.to(q.dtype), state.v.to(q.dtype)
        o = masked_attention(q, k, v, allowed, self._bias(t, capacity, state.position))
        return self._output(o), StaticKVCache(state.k, state.v, state.position + t)
