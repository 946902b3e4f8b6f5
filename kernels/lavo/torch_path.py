"""LAVO on PyTorch tensor ops: chunked, differentiable by autograd, fast enough on a CPU.

No n x n score matrix: the local window is computed by blocks (queries of one block
against the keys of their own and neighbouring blocks, with a band mask), and the
memory comes from a cumulative sum of the coefficients `c_j = B v_j` (CS, CC) or one
sum (NS, NC). One softmax runs over [window logits, memory logits]. Whatever the input
dtype, everything is computed in float32 (float64 if an input is float64) and the
result is cast back to q's dtype.

The decoding functions are here too: one causal-self step on a `LavoDecodeState`, the
state after a prefill, and cross-attention queries against a prepared `LavoSource`
(state.py has the layouts and the update rule).

Inputs are assumed checked (`checks.check_lavo_args`, `checks.check_lavo_step_args`);
conventions as in `reference.py`.
"""

import math

import torch
import torch.nn.functional as F

from ..common import compute_dtype
from .state import LavoDecodeState, LavoSource


def torch_lavo_attn(q, k, v, basis, rel_bias, mem_bias, *, window, causal, cross, segments, scale, kv_mask, cu_seqlens):
    """`lavo_attn` on the PyTorch path (same arguments, without `backend`). Autocast is
    switched off inside: the matmuls too run in float32, whatever the caller's autocast."""
    with torch.autocast(q.device.type, enabled=False):
        if cu_seqlens is not None:
            return _packed(q, k, v, basis, rel_bias, mem_bias, window, causal, segments, scale, kv_mask, cu_seqlens)
        return _unpacked(q, k, v, basis, rel_bias, mem_bias, window, causal, cross, segments, scale, kv_mask)


def _unpacked(q, k, v, basis, rel_bias, mem_bias, window, causal, cross, segments, scale, kv_mask):
    batch, n, heads, dim = q.shape
    m = k.shape[1]
    out_dtype = q.dtype
    if n == 0:
        return torch.zeros_like(q)
    cdt = compute_dtype(q.dtype, k.dtype, v.dtype, basis.dtype)
    scale = dim**-0.5 if scale is None else scale
    q, k, v = (x.transpose(1, 2).to(cdt) for x in (q, k, v))  # [B, H, T, d]
    basis = basis.to(cdt)
    mu = mem_bias.to(cdt).reshape(heads, -1).expand(heads, segments)  # [H, S]
    valid = torch.ones(batch, m, dtype=cdt, device=q.device) if kv_mask is None else kv_mask.to(cdt)  # [B, m], 1 = real

    c = coefficients(v, basis) * valid[:, None, :, None]  # [B, H, m, r]; padding contributes 0
    bq = q @ basis.transpose(1, 2)  # [B, H, n, r]
    if causal:
        means = prefix_means(c, valid)  # [B, H, m, r]
        n_head = min(n, m)  # queries t < m: window ending at t, memory over j <= t
        o = _local_and_memory(
            q[:, :, :n_head], k[:, :, :n_head], v[:, :, :n_head], valid[:, :n_head], rel_bias, scale,
            lo=0, hi=window - 1, h=means[:, :, :n_head, None], bq=bq[:, :, :n_head], mu=mu, basis=basis,
        )
        if n > m:  # CC, target longer than the source: queries t >= m all use t' = m - 1
            o = torch.cat([o, _tail(q[:, :, m:], k, v, valid, rel_bias, scale, window, means, bq[:, :, m:], mu, basis)], dim=2)
    elif not cross:  # NS
        half = window // 2
        h = segment_means(c, valid, 1)[:, :, None]  # [B, H, 1, 1, r]: one memory for every query
        o = _local_and_memory(q, k, v, valid, rel_bias, scale, lo=-half, hi=half, h=h, bq=bq, mu=mu, basis=basis)
    else:  # NC: memory only
        h = segment_means(c, valid, segments)[:, :, None]  # [B, H, 1, S, r]
        o = readout(None, h, bq, mu, basis, scale)[1]
    if not cross:
        o = o * valid[:, None, :, None]  # padded queries output 0
    return o.transpose(1, 2).to(out_dtype)


def coefficients(v, basis):
    """c = B v: v [B, H, m, d], basis [H, r, d] -> [B, H, m, r]."""
    return v @ basis.transpose(1, 2)


def prefix_means(c, valid):
    """h_t = mean of c_j over valid j <= t (0 where there is none): c [B, H, m, r], valid [B, m]."""
    counts = valid.cumsum(1).clamp(min=1)  # [B, m]
    return c.cumsum(2) / counts[:, None, :, None]


def segment_means(c, valid, segments):
    """Mean of c over each of `segments` contiguous parts of the valid positions (the
    k-th valid position of n goes to part floor(k * S / n)): -> [B, H, S, r]."""
    position_rank = valid.cumsum(1).long() - 1  # [B, m]: rank among the valid positions
    n_valid = valid.sum(1, keepdim=True).long().clamp(min=1)  # [B, 1]
    part = (position_rank.clamp(min=0) * segments) // n_valid  # [B, m]
    member = F.one_hot(part, segments).to(c.dtype) * valid[..., None]  # [B, m, S]
    sums = torch.einsum("bms,bhmr->bhsr", member, c)
    return sums / member.sum(1).clamp(min=1)[:, None, :, None]


def readout(local_logits, h, bq, mu, basis, scale):
    """One softmax over window logits and memory logits, and the memory's output.

    local_logits [B, H, N, L] (scaled, biased, -inf outside the window) or None;
    h [B, H, N or 1, S, r] memory coefficients; bq [B, H, N, r] = B q; mu [H, S];
    basis [H, r, d]. Returns (window weights [B, H, N, L] or None, memory output [B, H, N, d]).
    """
    segments, rank = h.shape[-2:]
    mem_logits = scale * h * bq.unsqueeze(-2) + mu[:, None, :, None]  # [B, H, N, S, r]
    mem_logits = mem_logits.flatten(-2)  # [B, H, N, S*r]
    logits = mem_logits if local_logits is None else torch.cat([local_logits, mem_logits], dim=-1)
    weights = torch.softmax(logits, dim=-1)
    n_local = logits.shape[-1] - segments * rank
    mem_weights = weights[..., n_local:].unflatten(-1, (segments, rank))  # [B, H, N, S, r]
    o_mem = (mem_weights * h).sum(-2) @ basis  # [B, H, N, r] @ [H, r, d] -> [B, H, N, d]
    return (None if local_logits is None else weights[..., :n_local]), o_mem


def _local_and_memory(q, k, v, valid, rel_bias, scale, *, lo, hi, h, bq, mu, basis):
    """Queries and keys of one length n; key j is in query t's window iff lo <= t - j <= hi,
    with bias rel_bias[:, t - j - lo]. Returns o [B, H, n, d]."""
    batch, heads, n, dim = q.shape
    block = max(hi, -lo, 1)
    before, after = math.ceil(max(hi, 0) / block), math.ceil(max(-lo, 0) / block)
    n_blocks = math.ceil(n / block)
    pad = n_blocks * block - n
    # q made contiguous first: F.pad with a pad that is 0 at run time copies q with its own
    # (transposed) strides, where a compiled graph with a symbolic pad expects a contiguous
    # result and its views of it fail
    qb = F.pad(q.contiguous(), (0, 0, 0, pad)).view(batch, heads, n_blocks, block, dim)
    kb = _neighbour_blocks(F.pad(k, (0, 0, 0, pad)), block, before, after)  # [B, H, nb, L, d]
    vb = _neighbour_blocks(F.pad(v, (0, 0, 0, pad)), block, before, after)
    validb = _neighbour_blocks(F.pad(valid, (0, pad))[:, None, :, None], block, before, after)  # [B, 1, nb, L, 1]

    span = kb.shape[3]  # L = (before + 1 + after) * block
    # delta = t - j for query offset a and key offset b of the window: before*block + a - b
    delta = before * block + torch.arange(block, device=q.device)[:, None] - torch.arange(span, device=q.device)
    inside = (delta >= lo) & (delta <= hi)  # [block, L]
    bias = rel_bias.to(q.dtype)[:, (delta - lo).clamp(0, hi - lo)]  # [H, block, L]
    logits = scale * qb @ kb.transpose(-1, -2) + bias[None, :, None]  # [B, H, nb, block, L]
    keep = inside & (validb.transpose(-1, -2) > 0)  # [B, 1, nb, block, L]
    logits = logits.masked_fill(~keep, float("-inf"))

    padded = n_blocks * block
    h = F.pad(h, (0, 0, 0, 0, 0, pad)) if h.shape[2] == n else h  # per-query memories get pad rows; [.., 1, ..] broadcasts
    local_weights, o_mem = readout(logits.view(batch, heads, padded, span), h, F.pad(bq, (0, 0, 0, pad)), mu, basis, scale)
    o_local = local_weights.view(batch, heads, n_blocks, block, span) @ vb  # [B, H, nb, block, d]
    return (o_local.view(batch, heads, padded, dim) + o_mem)[:, :, :n]


def _neighbour_blocks(x, block, before, after):
    """x [B, H', nb*block, d] -> [B, H', nb, (before + 1 + after) * block, d]: block i
    with the `before` blocks preceding it and the `after` blocks following it, in order
    (zeros beyond either end); entry b of block i's span is position (i - before) * block + b."""
    n_blocks = x.shape[2] // block
    padded = F.pad(x, (0, 0, before * block, after * block))
    blocks = padded.unflatten(2, (n_blocks + before + after, block))  # [B, H', nb + before + after, block, d]
    return torch.cat([blocks[:, :, s : s + n_blocks] for s in range(before + 1 + after)], dim=3)


def _tail(q, k, v, valid, rel_bias, scale, window, means, bq, mu, basis):
    """CC queries at t >= m: all see the window ending at m - 1 and the whole source's
    memory. q [B, H, n - m, d] -> o [B, H, n - m, d]."""
    m = k.shape[2]
    span = min(window, m)
    logits = scale * q @ k[:, :, m - span :].transpose(-1, -2)  # [B, H, n - m, span]
    logits = logits + rel_bias.to(q.dtype)[:, None, :span].flip(-1)  # key m - span + b: bias rho[span - 1 - b]
    logits = logits.masked_fill(valid[:, None, None, m - span :] == 0, float("-inf"))
    h = means[:, :, m - 1 :, None]  # [B, H, 1, 1, r]
    local_weights, o_mem = readout(logits, h, bq, mu, basis, scale)
    return local_weights @ v[:, :, m - span :] + o_mem


def _packed(q, k, v, basis, rel_bias, mem_bias, window, causal, segments, scale, kv_mask, cu_seqlens):
    """Packed self-attention sequences [1, T, H, d]: gathered into a padded batch
    [N, max_len, H, d] with a padding mask, run together, and packed back."""
    offsets = cu_seqlens.to(q.device).long()
    lengths = offsets[1:] - offsets[:-1]
    max_len = int(lengths.max()) if len(lengths) and q.shape[1] else 0
    if max_len == 0:
        return torch.zeros_like(q)
    steps = torch.arange(max_len, device=q.device)
    inside = steps[None, :] < lengths[:, None]  # [N, max_len]
    index = (offsets[:-1, None] + steps[None, :]).clamp(max=q.shape[1] - 1)  # [N, max_len]
    mask = inside if kv_mask is None else inside & kv_mask[0, index]
    o = _unpacked(q[0, index], k[0, index], v[0, index], basis, rel_bias, mem_bias, window, causal, False, segments, scale, mask)
    return o[inside].unsqueeze(0)  # sequences in order, each without its padding


def torch_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, *, window, scale):
    """`lavo_decode_step` on the PyTorch path (same arguments, without `backend`), in the
    dtype of `state.mem_sum` with autocast switched off."""
    with torch.autocast(q.device.type, enabled=False):
        return _step(q, k, v, basis, rel_bias, mem_bias, state, window, scale)


def _step(q, k, v, basis, rel_bias, mem_bias, state, window, scale):
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
        slot = torch.as_tensor(t % ring, device=q.device).reshape(1)  # t: an int or a 0-dim tensor
        keys = keys.index_copy(2, slot, k[:, :, None].to(keys.dtype))
        values = values.index_copy(2, slot, v[:, :, None].to(values.dtype))
    return o[:, :, 0].to(q.dtype), LavoDecodeState(keys, values, mem_sum, t + 1)


def torch_lavo_prefill_state(k, v, basis, *, window) -> LavoDecodeState:
    """The LavoDecodeState after the positions of k, v [B, T, H, d]: the memory sum of all
    of them (autocast off) and the last w-1 in the ring buffer."""
    batch, steps, heads, dim = k.shape
    empty = LavoDecodeState.empty(batch, heads, dim, basis.shape[1], window, dtype=k.dtype, device=k.device)
    cdt = empty.mem_sum.dtype
    with torch.autocast(k.device.type, enabled=False):
        mem_sum = coefficients(v.transpose(1, 2).to(cdt), basis.to(cdt)).sum(2)  # [B, H, r]
    keys, values, ring = empty.keys.clone(), empty.values.clone(), window - 1
    if ring:
        positions = torch.arange(max(0, steps - ring), steps, device=k.device)  # the last w-1 positions
        keys[:, :, positions % ring] = k[:, positions].transpose(1, 2)
        values[:, :, positions % ring] = v[:, positions].transpose(1, 2)
    return LavoDecodeState(keys, values, mem_sum, steps)


def torch_lavo_source(k, v, basis, *, causal, segments, kv_mask) -> LavoSource:
    """`lavo_source`: CC, k, v [B, m, H, d] as [B, H, m, d] in their dtype, with the
    prefix means; NC, the segment means alone. The means in the compute dtype, autocast
    off."""
    with torch.autocast(k.device.type, enabled=False):
        cdt = compute_dtype(k.dtype, v.dtype, basis.dtype)
        valid = torch.ones(k.shape[:2], dtype=cdt, device=k.device) if kv_mask is None else kv_mask.to(cdt)
        c = coefficients(v.transpose(1, 2).to(cdt), basis.to(cdt)) * valid[:, None, :, None]  # [B, H, m, r]
        if not causal:
            return LavoSource(None, None, valid, segment_means(c, valid, segments), causal)
        keys, values = (x.transpose(1, 2).contiguous() for x in (k, v))  # [B, m, H, d] -> [B, H, m, d]
        return LavoSource(keys, values, valid, prefix_means(c, valid), causal)


def torch_lavo_cross_decode(q, source, basis, rel_bias, mem_bias, *, window, start, scale):
    """`lavo_cross_decode` (same arguments), autocast off."""
    with torch.autocast(q.device.type, enabled=False):
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
    keys, values = source.keys[:, :, index].to(cdt), source.values[:, :, index].to(cdt)  # [B, H, t, w, d]
    logits = scale * (keys @ qc[..., None])[..., 0] + rel_bias.to(cdt)[:, None, :]  # [B, H, t, w]
    real = (source.valid[:, index] > 0) & (position >= 0)  # [B, t, w]
    logits = logits.masked_fill(~real[:, None], float("-inf"))
    local_weights, o_mem = readout(logits, source.means[:, :, anchor, None], bq, mu, basis_c, scale)
    o = (local_weights[..., None] * values).sum(-2) + o_mem  # [B, H, t, d]
    return o.transpose(1, 2).to(q.dtype)
