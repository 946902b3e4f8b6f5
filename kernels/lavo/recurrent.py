"""LAVO decode step on Triton: one causal-self token per call, on the constant-size
`LavoDecodeState` (decode.py says the layout and the update rule).

One program per (batch row, head): the memory sum takes B v_t, the r memory logits come
from h = sum / (t + 1), then the ring buffer's filled slots (in blocks, one online
softmax) and the current token; the new key and value go into slot t % (w-1) after
every slot was read. Cost O((w + r) d) per head, whatever the context length.
"""

import functools

import torch
import triton
import triton.language as tl

RING_BLOCK = 64  # buffer slots per step of the loop over the ring


@triton.jit
def lavo_step_kernel(
    Q, K, V, BAS, RHO, MU, KEYS, VALUES, MEM, O,
    H, t, scale,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
    RING: tl.constexpr, BLK: tl.constexpr, NBLK: tl.constexpr,
):
    bh = tl.program_id(0)  # b * H + h
    h = bh % H
    dd = tl.arange(0, BD)
    rr = tl.arange(0, BR)
    d_ok = dd < D
    r_ok = rr < R
    q = tl.load(Q + bh * D + dd, mask=d_ok, other=0.0).to(tl.float32)
    k = tl.load(K + bh * D + dd, mask=d_ok, other=0.0)
    v = tl.load(V + bh * D + dd, mask=d_ok, other=0.0)
    basis = tl.load(BAS + h * R * D + rr[:, None] * D + dd[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)

    # memory: S += B v_t, h = S / (t + 1), logits scale * h_i (B q)_i + mu (log2 units)
    mem = tl.load(MEM + bh * R + rr, mask=r_ok, other=0.0) + tl.sum(basis * v.to(tl.float32)[None, :], 1)
    tl.store(MEM + bh * R + rr, mem, mask=r_ok)
    hm = mem / (t + 1)
    g = tl.sum(basis * q[None, :], 1)
    e = tl.where(r_ok, (scale * hm * g + tl.load(MU + h)) * 1.4426950408889634, float("-inf"))

    # the current token (bias rel_bias[0]) joins the memory logits to start the softmax
    s_cur = (scale * tl.sum(q * k.to(tl.float32), 0) + tl.load(RHO + h * (RING + 1))) * 1.4426950408889634
    m_i = tl.maximum(tl.max(e, 0), s_cur)
    pm = tl.exp2(e - m_i)
    p_cur = tl.exp2(s_cur - m_i)
    l_i = tl.sum(pm, 0) + p_cur
    acc = tl.sum((pm * hm)[:, None] * basis, 0) + p_cur * v.to(tl.float32)  # [BD]

    # the ring buffer: slot s holds position t - RING + ((s - t + RING) mod RING), if >= 0
    for b in range(NBLK):
        slot = b * BLK + tl.arange(0, BLK)
        position = t - RING + (slot - t % RING + RING) % RING
        ok = (slot < RING) & (position >= 0)
        offs = (bh * RING + slot)[:, None].to(tl.int64) * D + dd[None, :]
        kb = tl.load(KEYS + offs, mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        vb = tl.load(VALUES + offs, mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        bias = tl.load(RHO + h * (RING + 1) + (t - position), mask=ok, other=0.0)
        s = tl.where(ok, (scale * tl.sum(kb * q[None, :], 1) + bias) * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * vb, 0)
        m_i = m_new
    tl.store(O + bh * D + dd, (acc / l_i).to(O.dtype.element_ty), mask=d_ok)

    if RING > 0:  # every slot was read above; now the current token replaces position t - RING
        tl.debug_barrier()
        offs = (bh * RING + t % RING).to(tl.int64) * D + dd
        tl.store(KEYS + offs, k, mask=d_ok)
        tl.store(VALUES + offs, v, mask=d_ok)


def recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, *, window, scale=None):
    """`lavo_decode_step` on Triton (same arguments without `backend`, checked by the
    caller): q, k, v [B, H, d] -> (o [B, H, d], state), state updated in place.

    A decode step is a few microseconds of GPU work, so the host side is kept to the
    launch: tensors already in the layout the kernel reads are passed as they are."""
    if state.mem_sum.dtype != torch.float32 or q.dtype == torch.float64:
        raise NotImplementedError("float64 decoding has no Triton kernel; use backend='torch'")
    if not (state.keys.is_contiguous() and state.values.is_contiguous() and state.mem_sum.is_contiguous()):
        raise ValueError("state.keys/values/mem_sum: the Triton step updates them in place; they must be contiguous")
    batch, heads, dim = q.shape
    scale = dim**-0.5 if scale is None else float(scale)
    q, k, v = _ready(q, q.dtype), _ready(k, state.keys.dtype), _ready(v, state.values.dtype)
    o = torch.empty_like(q)
    # the kernel reads mem_bias[h] of a contiguous [H] or [H, 1] tensor alike
    lavo_step_kernel[(batch * heads,)](
        q, k, v, _ready(basis, torch.float32), _ready(rel_bias, torch.float32), _ready(mem_bias, torch.float32),
        state.keys, state.values, state.mem_sum, o, heads, state.count, scale,
        **_step_meta(dim, basis.shape[1], window),
    )
    state.count += 1
    return o, state


def _ready(x, dtype):
    """x as a contiguous tensor of `dtype`, without a copy (or a new tensor object) when it
    already is one."""
    return x if x.dtype == dtype and x.is_contiguous() else x.detach().to(dtype).contiguous()


@functools.lru_cache(maxsize=None)
def _step_meta(dim, rank, window):
    """The kernel's compile-time arguments for a head dim, rank and window."""
    ring = window - 1
    blk = min(RING_BLOCK, max(16, triton.next_power_of_2(max(ring, 1))))
    return dict(
        D=dim, R=rank, BD=max(16, triton.next_power_of_2(dim)), BR=max(16, triton.next_power_of_2(rank)),
        RING=ring, BLK=blk, NBLK=triton.cdiv(ring, blk), num_warps=4,
    )
