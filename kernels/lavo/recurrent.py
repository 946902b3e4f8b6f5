"""LAVO decode step on Triton: one causal-self token per call, on the constant-size
`LavoDecodeState` (state.py says the layout and the update rule).

One program per (batch row, head): the memory sum takes B v_t, the r memory logits come
from h = sum / (t + 1), then the ring buffer's filled slots (in blocks, one online
softmax) and the current token. The new state goes to new buffers: each block of the
ring is written out as it is read, with the current key and value in slot t % (w-1),
so the ring is read once and written once and the given state is left as it was.
Cost O((w + r) d) per head, whatever the context length.
"""

import functools

import torch
import triton
import triton.language as tl

from ..common import cdiv, tile_width
from .state import LavoDecodeState

RING_BLOCK = 64  # buffer slots per step of the loop over the ring


@triton.jit
def online_softmax_block(m_i, l_i, acc, s, values):
    """One block of a query's online softmax: logits s [N] (log2 units, -inf where left
    out) and their values [N, D] folded into the running max m_i, sum l_i and weighted
    sum acc [D]; returns the three updated."""
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * values, 0)


@triton.jit
def lavo_step_kernel(
    Q, K, V, BAS, RHO, MU, KEYS, VALUES, MEM, NEW_KEYS, NEW_VALUES, NEW_MEM, O,
    H, T, scale,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
    RING: tl.constexpr, BLK: tl.constexpr, NBLK: tl.constexpr, T_ON_DEVICE: tl.constexpr,
):
    bh = tl.program_id(0)  # b * H + h
    # the position: an int, or a 0-dim tensor read here (a captured decode replays the
    # launch as it was recorded, so the position must come from device memory)
    if T_ON_DEVICE:
        t = tl.load(T)
    else:
        t = T
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
    tl.store(NEW_MEM + bh * R + rr, mem, mask=r_ok)
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

    # the ring buffer: slot s holds position t - RING + ((s - t + RING) mod RING), if >= 0;
    # every slot is copied to the new buffers, slot t % RING with the current token instead
    for b in range(NBLK):
        slot = b * BLK + tl.arange(0, BLK)
        position = t - RING + (slot - t % RING + RING) % RING
        in_ring = (slot < RING)[:, None] & d_ok[None, :]
        ok = (slot < RING) & (position >= 0)
        offs = (bh * RING + slot)[:, None].to(tl.int64) * D + dd[None, :]
        kb = tl.load(KEYS + offs, mask=in_ring, other=0.0)
        vb = tl.load(VALUES + offs, mask=in_ring, other=0.0)
        current = (slot == t % RING)[:, None]
        tl.store(NEW_KEYS + offs, tl.where(current, k[None, :], kb), mask=in_ring)
        tl.store(NEW_VALUES + offs, tl.where(current, v[None, :], vb), mask=in_ring)
        kb = tl.where(ok[:, None], kb.to(tl.float32), 0.0)
        vb = tl.where(ok[:, None], vb.to(tl.float32), 0.0)
        bias = tl.load(RHO + h * (RING + 1) + (t - position), mask=ok, other=0.0)
        s = tl.where(ok, (scale * tl.sum(kb * q[None, :], 1) + bias) * 1.4426950408889634, float("-inf"))
        m_i, l_i, acc = online_softmax_block(m_i, l_i, acc, s, vb)
    tl.store(O + bh * D + dd, (acc / l_i).to(O.dtype.element_ty), mask=d_ok)


def recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, *, window, scale=None):
    """`lavo_decode_step` on Triton (same arguments without `backend`, checked by the
    caller): q, k, v [B, H, d] -> (o [B, H, d], the state after the token); `state` is
    left as it was. `state.count` is an int or a 0-dim long tensor on q's device (the
    kernel reads it there, so a CUDA graph of the step serves every position); the new
    count is of the same kind.

    A decode step is a few microseconds of GPU work, so the host side is kept to the
    launch: tensors already in the layout the kernel reads are passed as they are."""
    if state.mem_sum.dtype != torch.float32 or q.dtype == torch.float64:
        raise NotImplementedError("float64 decoding has no Triton kernel; use backend='torch'")
    batch, heads, dim = q.shape
    scale = dim**-0.5 if scale is None else float(scale)
    keys, values = _ready(state.keys, state.keys.dtype), _ready(state.values, state.values.dtype)
    mem_sum = _ready(state.mem_sum, torch.float32)
    q, k, v = _ready(q, q.dtype), _ready(k, keys.dtype), _ready(v, values.dtype)
    count = state.count
    on_device = isinstance(count, torch.Tensor)
    if on_device and (count.dim() != 0 or count.dtype != torch.long or count.device != q.device):
        raise ValueError(f"state.count: an int or a 0-dim long tensor on {q.device}, got {count.dtype} "
                         f"{tuple(count.shape)} on {count.device}")
    new = LavoDecodeState(torch.empty_like(keys), torch.empty_like(values), torch.empty_like(mem_sum), count + 1)
    o = torch.empty_like(q)
    # the kernel reads mem_bias[h] of a contiguous [H] or [H, 1] tensor alike
    lavo_step_kernel[(batch * heads,)](
        q, k, v, _ready(basis, torch.float32), _ready(rel_bias, torch.float32), _ready(mem_bias, torch.float32),
        keys, values, mem_sum, new.keys, new.values, new.mem_sum, o, heads, count, scale,
        T_ON_DEVICE=on_device, **_step_meta(dim, basis.shape[1], window),
    )
    return o, new


def _ready(x, dtype):
    """x as a contiguous tensor of `dtype`, without a copy (or a new tensor object) when it
    already is one."""
    return x if x.dtype == dtype and x.is_contiguous() else x.detach().to(dtype).contiguous()


@functools.lru_cache(maxsize=None)
def _step_meta(dim, rank, window):
    """The kernel's compile-time arguments for a head dim, rank and window."""
    ring = window - 1
    blk = min(RING_BLOCK, tile_width(max(ring, 1)))
    return dict(
        D=dim, R=rank, BD=tile_width(dim), BR=tile_width(rank),
        RING=ring, BLK=blk, NBLK=cdiv(ring, blk), num_warps=4,
    )
