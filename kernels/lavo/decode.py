"""LAVO decoding: constant-size state for causal self-attention, a prepared source for
cross-attention. Layout and update rule here are the contract the Triton decode kernel
(`recurrent.recurrent_lavo_step`) implements as well. States are values: a step returns
a new state and leaves the one it was given as it was.
"""

from typing import NamedTuple

import torch

from ..backend import resolve_backend, run_triton
from ..common import compute_dtype
from .attn import lavo_attn
from .checks import check_lavo_step_args
from .torch_path import coefficients, prefix_means, readout, segment_means


class LavoDecodeState(NamedTuple):
    """What causal self-attention (CS) keeps between tokens, per batch row and head.

    - `keys`, `values` [B, H, w-1, d], in the dtype of k and v: a ring buffer of the
      last w-1 positions. Position p lives in slot `p % (w-1)`; before step t (t =
      `count`) the slots hold positions t-w+1 .. t-1, and a slot whose position would
      be negative (t < w-1) is empty and never read. w = 1 gives an empty buffer.
    - `mem_sum` [B, H, r], float32 (float64 for float64 inputs): the sum of
      c_j = B v_j over all positions seen.
    - `count` (int): how many positions have been seen, the same for every row.

    A step at position t = count: mem_sum += B v_t; h = mem_sum / (t + 1); logits over
    the filled buffer slots (bias rel_bias[t - p]), the current token (bias rel_bias[0])
    and the r memory slots; then k_t, v_t are written to slot t % (w-1) and count becomes
    t + 1. The step writes the new buffer and sum into new tensors.
    """

    keys: torch.Tensor
    values: torch.Tensor
    mem_sum: torch.Tensor
    count: int = 0

    @classmethod
    def empty(cls, batch: int, heads: int, head_dim: int, rank: int, window: int, *, dtype=torch.float32, device=None):
        """The state before the first token."""
        ring = torch.zeros(batch, heads, window - 1, head_dim, dtype=dtype, device=device)
        sums = torch.zeros(batch, heads, rank, dtype=compute_dtype(dtype), device=device)
        return cls(ring, ring.clone(), sums, 0)


def lavo_decode_step(q, k, v, basis, rel_bias, mem_bias, state, *, window, scale=None, backend="auto"):
    """One CS token: q, k, v [B, H, d] -> (o [B, H, d], state), the output of
    `lavo_attn(..., causal=True, cross=False)` at position `state.count`.

    basis [H, r, d], rel_bias [H, window], mem_bias [H] (or [H, 1]). `state` (see
    LavoDecodeState) is left as it was; the state after the token is returned. Cost
    O((w + r) d) per head.
    """
    check_lavo_step_args(q, k, v, basis, rel_bias, mem_bias, state, window)
    def run_torch():
        with torch.autocast(q.device.type, enabled=False):  # float32 matmuls whatever the caller's autocast
            return _torch_step(q, k, v, basis, rel_bias, mem_bias, state, window, scale)

    if resolve_backend(backend, q) == "triton":
        def run_kernel():  # checks what it covers before it touches the state
            from .recurrent import recurrent_lavo_step

            return recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, window=window, scale=scale)

        return run_triton(backend, "lavo_decode_step", run_kernel, run_torch)
    return run_torch()


def lavo_prefill(q, k, v, basis, rel_bias, mem_bias, *, window, scale=None, backend="auto"):
    """The first T positions at once: q, k, v [B, T, H, d] -> (o [B, T, H, d], state), o
    from `lavo_attn` (CS) and `state` the LavoDecodeState after those T positions, as T
    calls of `lavo_decode_step` from an empty state would leave it."""
    o = lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=window, scale=scale, backend=backend)
    batch, steps, heads, dim = k.shape
    empty = LavoDecodeState.empty(batch, heads, dim, basis.shape[1], window, dtype=k.dtype, device=k.device)
    cdt = empty.mem_sum.dtype
    with torch.autocast(k.device.type, enabled=False):  # the sum in float32 whatever the caller's autocast
        mem_sum = coefficients(v.transpose(1, 2).to(cdt), basis.to(cdt)).sum(2)  # [B, H, r]
    keys, values, ring = empty.keys.clone(), empty.values.clone(), window - 1
    if ring:
        positions = torch.arange(max(0, steps - ring), steps, device=k.device)  # the last w-1 positions
        keys[:, :, positions % ring] = k[:, positions].transpose(1, 2)
        values[:, :, positions % ring] = v[:, positions].transpose(1, 2)
    return o, LavoDecodeState(keys, values, mem_sum, steps)


def _torch_step(q, k, v, basis, rel_bias, mem_bias, state, window, scale):
    heads, dim = q.shape[1:]
    cdt = state.mem_sum.dtype
    scale = dim**-0.5 if scale is None else scale
    t, ring = state.count, window - 1
    qc, kc, vc, basis_c = (x.to(cdt) for x in (q, k, v, basis))
    mem_sum = state.mem_sum + coefficients(vc[:, :, None], basis_c)[:, :, 0]
    h = mem_sum / (t + 1)  # [B, H, r]

    slot = torch.arange(ring, device=q.device)
    position = t - ring + (slot - (t - ring)) % ring  # the position each slot holds
    bias = torch.cat([rel_bias[:, (t - position).clamp(max=window - 1)], rel_bias[:, :1]], dim=1).to(cdt)  # [H, w]
    keys = torch.cat([state.keys.to(cdt), kc[:, :, None]], dim=2)  # [B, H, w, d]: buffer, then the current token
    values = torch.cat([state.values.to(cdt), vc[:, :, None]], dim=2)
    logits = scale * (keys @ qc[..., None])[..., 0] + bias  # [B, H, w]
    logits[..., :ring] = logits[..., :ring].masked_fill(position < 0, float("-inf"))

    mu = mem_bias.to(cdt).reshape(heads, 1)
    bq = coefficients(qc[:, :, None], basis_c)  # [B, H, 1, r]
    local_weights, o_mem = readout(logits[:, :, None], h[:, :, None, None], bq, mu, basis_c, scale)
    o = local_weights @ values + o_mem  # [B, H, 1, d]

    keys, values = state.keys, state.values
    if ring:
        slot = torch.tensor([t % ring], device=q.device)
        keys = keys.index_copy(2, slot, k[:, :, None].to(keys.dtype))
        values = values.index_copy(2, slot, v[:, :, None].to(values.dtype))
    return o[:, :, 0].to(q.dtype), LavoDecodeState(keys, values, mem_sum, t + 1)


class LavoSource(NamedTuple):
    """A cross-attention source prepared once for decoding (CC, NC).

    keys, values [B, H, m, d] and valid [B, m] (1 = real position) in the compute dtype;
    `means`: CC, the prefix means h_t [B, H, m, r]; NC, the segment means [B, H, S, r].
    """

    keys: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor
    means: torch.Tensor
    causal: bool


def lavo_source(k, v, basis, *, causal, segments=1, kv_mask=None) -> LavoSource:
    """Prepare the source k, v [B, m, H, d] (kv_mask [B, m]) once: O(m r) memory sums."""
    with torch.autocast(k.device.type, enabled=False):  # float32 whatever the caller's autocast
        return _source(k, v, basis, causal, segments, kv_mask)


def _source(k, v, basis, causal, segments, kv_mask):
    cdt = compute_dtype(k.dtype, v.dtype, basis.dtype)
    keys, values = (x.transpose(1, 2).to(cdt) for x in (k, v))  # [B, H, m, d]
    valid = torch.ones(k.shape[:2], dtype=cdt, device=k.device) if kv_mask is None else kv_mask.to(cdt)
    c = coefficients(values, basis.to(cdt)) * valid[:, None, :, None]  # [B, H, m, r]
    means = prefix_means(c, valid) if causal else segment_means(c, valid, segments)
    return LavoSource(keys, values, valid, means, causal)


def lavo_cross_decode(q, source: LavoSource, basis, rel_bias, mem_bias, *, window, start, scale=None):
    """Outputs of target positions start .. start+t-1 (q [B, t, H, d]) against a
    prepared source: what `lavo_attn(..., cross=True)` gives at those positions.

    CC: query p uses the window ending at p' = min(p, m-1) and the memory of j <= p'
    (cost O(t (w + r) d)); NC: the segment memories only (O(t S r d)). PyTorch ops only.
    """
    with torch.autocast(q.device.type, enabled=False):  # float32 whatever the caller's autocast
        return _cross_decode(q, source, basis, rel_bias, mem_bias, window, start, scale)


def _cross_decode(q, source, basis, rel_bias, mem_bias, window, start, scale):
    batch, steps, heads, dim = q.shape
    cdt = source.means.dtype
    scale = dim**-0.5 if scale is None else scale
    qc = q.transpose(1, 2).to(cdt)  # [B, H, t, d]
    basis_c = basis.to(cdt)
    bq = coefficients(qc, basis_c)  # [B, H, t, r]
    segments = 1 if source.causal else source.means.shape[2]
    mu = mem_bias.to(cdt).reshape(heads, -1).expand(heads, segments)  # [H, S]
    if not source.causal:
        o = readout(None, source.means[:, :, None], bq, mu, basis_c, scale)[1]
        return o.transpose(1, 2).to(q.dtype)

    m = source.keys.shape[2]
    anchor = (start + torch.arange(steps, device=q.device)).clamp(max=m - 1)  # [t]
    back = torch.arange(window, device=q.device)  # t' - j, the rel_bias index
    position = anchor[:, None] - back  # [t, w]
    index = position.clamp(min=0)
    keys, values = source.keys[:, :, index], source.values[:, :, index]  # [B, H, t, w, d]
    logits = scale * (keys @ qc[..., None])[..., 0] + rel_bias.to(cdt)[:, None, :]  # [B, H, t, w]
    real = (source.valid[:, index] > 0) & (position >= 0)  # [B, t, w]
    logits = logits.masked_fill(~real[:, None], float("-inf"))
    local_weights, o_mem = readout(logits, source.means[:, :, anchor, None], bq, mu, basis_c, scale)
    o = (local_weights[..., None] * values).sum(-2) + o_mem  # [B, H, t, d]
    return o.transpose(1, 2).to(q.dtype)
