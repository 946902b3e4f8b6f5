"""`local`: sliding-window softmax attention, the local-only ablation of LAVO (CS, NS).

With window w, causal self-attention (CS) lets query t see keys t-w < j <= t;
noncausal (NS) lets it see |t - j| <= w/2 (w even). Memory is O(T w): queries are cut
into blocks of c = min(w, T) positions, and each block attends to its own key block and
its neighbours (the previous one; and the next one in NS) under a band mask, never to
a T x T score matrix.
"""

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .base import Namer, argument_name, check_window
from .softmax import SoftmaxAttention, masked_attention


def _shift_blocks(x: torch.Tensor, shift: int, dim: int) -> torch.Tensor:
    """Block n of the result is block n + shift of x along `dim` (zeros / False past the ends)."""
    if shift == 0:
        return x
    n = x.shape[dim]
    pad = torch.zeros_like(x.narrow(dim, 0, min(abs(shift), n)))
    if shift > 0:
        return torch.cat([x.narrow(dim, shift, n - shift), pad], dim=dim) if shift < n else pad
    return torch.cat([pad, x.narrow(dim, 0, n + shift)], dim=dim) if -shift < n else pad


def window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, causal: bool, key_mask=None
) -> torch.Tensor:
    """Self-attention of q, k, v [B, H, T, d] restricted to the window (module docstring);
    key_mask [B, T] bool (True = real) or None. A query that sees no key outputs 0."""
    B, H, T, d = q.shape
    c = min(window, T)  # block size: the window reaches at most one block either side
    n = -(-T // c)  # number of blocks
    pad = n * c - T
    valid = torch.ones(B, T, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    q, k, v = (F.pad(t, (0, 0, 0, pad)).view(B, H, n, c, d) for t in (q, k, v))  # [B, H, n, c, d]
    valid = F.pad(valid, (0, pad), value=False).view(B, n, c)  # [B, n, c]
    shifts = (-1, 0) if causal else (-1, 0, 1)
    keys = torch.cat([_shift_blocks(k, s, 2) for s in shifts], dim=3)  # [B, H, n, K, d], K = len(shifts) * c
    values = torch.cat([_shift_blocks(v, s, 2) for s in shifts], dim=3)
    key_valid = torch.cat([_shift_blocks(valid, s, 1) for s in shifts], dim=2)  # [B, n, K]
    # Key slot s of a block sits rel = s - c - i positions from the block's query i,
    # whatever the block: the band is one [c, K] mask.
    rel = torch.arange(len(shifts) * c, device=q.device)[None, :] - c - torch.arange(c, device=q.device)[:, None]
    band = (rel > -window) & (rel <= 0) if causal else rel.abs() <= window // 2
    allowed = band[None, None, None] & key_valid[:, None, :, None, :]  # [B, 1, n, c, K]
    out = masked_attention(q, keys, values, allowed)  # [B, H, n, c, d]
    return out.reshape(B, H, n * c, d)[:, :, :T]


class WindowCache(NamedTuple):
    """Decode state of `local` (CS), of fixed size: the keys (rotated at their positions)
    and values of the last w-1 positions, oldest first (the design's ring buffer, kept in
    order by shifting). Slot s holds position `position - (w-1) + s`; while fewer than
    w-1 positions were seen, the first slots hold none (zeros, never read). With the
    current position, that is the window."""

    k: torch.Tensor  # [B, H, w-1, d]
    v: torch.Tensor  # [B, H, w-1, d]
    position: int  # how many positions came before the next call


class LocalAttention(SoftmaxAttention):
    name = "local"
    patterns = frozenset({"CS", "NS"})

    @classmethod
    def check_arguments(cls, options: Mapping, d_model: int, n_heads: int, pattern: str, *,
                        name: Namer = argument_name) -> None:
        super().check_arguments(options, d_model, n_heads, pattern, name=name)
        check_window(options.get("window"), pattern, name)

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, window: int = 32):
        super().__init__(d_model, n_heads, causal=causal, cross=cross, window=window)
        self.window = window

    def _attend(self, q, k, v, key_mask):
        return window_attention(q, k, v, window=self.window, causal=self.causal, key_mask=key_mask)

    def _self_state(self, batch_size: int) -> WindowCache:
        empty = self.q_proj.weight.new_zeros(batch_size, self.n_heads, self.window - 1, self.head_dim)
        return WindowCache(empty, empty, 0)

    def _step(self, x, state: WindowCache):
        # The buffer followed by the t new positions is one contiguous stretch of
        # positions, so the windowed attention of the whole stretch (queries at the
        # buffer slots are dummies, dropped) gives the new positions' outputs.
        B, t, keep = x.shape[0], x.shape[1], self.window - 1
        q = self._queries(x, state.position)
        k_new, v_new = self._keys_values(x, state.position)
        dtype = q.dtype  # under autocast the buffer may have been made in another dtype
        k = torch.cat([state.k.to(dtype), k_new.to(dtype)], dim=2)  # [B, H, w-1+t, d]
        v = torch.cat([state.v.to(dtype), v_new.to(dtype)], dim=2)
        filled = torch.arange(keep + t, device=x.device) >= keep - state.position  # slot holds a position >= 0
        q = F.pad(q, (0, 0, keep, 0))  # [B, H, w-1+t, d]
        o = window_attention(q, k, v, window=self.window, causal=True, key_mask=filled.expand(B, -1))
        cache = WindowCache(k[:, :, t:], v[:, :, t:], state.position + t)
        return self._output(o[:, :, keep:]), cache
