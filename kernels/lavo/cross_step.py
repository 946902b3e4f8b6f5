"""LAVO causal cross-attention (CC) decode step on Triton: one target position per call
against a source prepared by `lavo_source` (state.LavoSource).

One program per (batch row, head). Target position p reads the window of w source
positions ending at a = min(p, m - 1) (bias rel_bias[a - j], padded positions left out)
and the r memory slots of the prefix mean h_a (logits scale * h_a,i (B q)_i + mu), in one
online softmax; the output is the window's weighted values plus sum_i weight_i h_a,i B_i.
The same function as `torch_path.torch_lavo_cross_decode` for one position, in fp32; the
position is an int or a 0-dim tensor read in the kernel (a captured decode replays the
launch as recorded). Cost O((w + r) d) per head, whatever the source length.
"""

import functools

import torch
import triton
import triton.language as tl

from ..common import cdiv, tile_width
from .recurrent import _ready, online_softmax_block
from .state import LavoSource

WINDOW_BLOCK = 64  # source positions per step of the loop over the window


@triton.jit
def lavo_cross_step_kernel(
    Q, KEYS, VALUES, VALID, MEANS, BAS, RHO, MU, O,
    H, M, P, scale,
    sk_b, sk_h, sk_m, sv_b, sv_h, sv_m, sn_b, sn_h, sn_m, sw_b,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
    W: tl.constexpr, BLK: tl.constexpr, NBLK: tl.constexpr, P_ON_DEVICE: tl.constexpr,
):
    bh = tl.program_id(0)  # b * H + h
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    if P_ON_DEVICE:
        p = tl.load(P)
    else:
        p = P
    a = tl.minimum(p, M - 1)  # the last source position this query reads
    dd = tl.arange(0, BD)
    rr = tl.arange(0, BR)
    d_ok = dd < D
    r_ok = rr < R
    q = tl.load(Q + bh * D + dd, mask=d_ok, other=0.0).to(tl.float32)
    basis = tl.load(BAS + h * R * D + rr[:, None] * D + dd[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)

    # memory: logits scale * h_a,i (B q)_i + mu (log2 units) start the softmax
    hm = tl.load(MEANS + b * sn_b + h * sn_h + a * sn_m + rr, mask=r_ok, other=0.0)
    bq = tl.sum(basis * q[None, :], 1)
    e = tl.where(r_ok, (scale * hm * bq + tl.load(MU + h)) * 1.4426950408889634, float("-inf"))
    m_i = tl.max(e, 0)
    pm = tl.exp2(e - m_i)
    l_i = tl.sum(pm, 0)
    acc = tl.sum((pm * hm)[:, None] * basis, 0)  # [BD]

    # the window: source positions a - back for back = 0 .. w-1, real and >= 0
    for blk in range(NBLK):
        back = blk * BLK + tl.arange(0, BLK)
        j = a - back
        in_window = (back < W) & (j >= 0)
        real = tl.load(VALID + b * sw_b + j, mask=in_window, other=0.0)
        ok = in_window & (real > 0)
        kv_ok = ok[:, None] & d_ok[None, :]
        kb = tl.load(KEYS + b * sk_b + h * sk_h + j[:, None] * sk_m + dd[None, :], mask=kv_ok, other=0.0)
        vb = tl.load(VALUES + b * sv_b + h * sv_h + j[:, None] * sv_m + dd[None, :], mask=kv_ok, other=0.0)
        kb, vb = kb.to(tl.float32), vb.to(tl.float32)
        bias = tl.load(RHO + h * W + back, mask=back < W, other=0.0)
        s = tl.where(ok, (scale * tl.sum(kb * q[None, :], 1) + bias) * 1.4426950408889634, float("-inf"))
        m_i, l_i, acc = online_softmax_block(m_i, l_i, acc, s, vb)
    tl.store(O + bh * D + dd, (acc / l_i).to(O.dtype.element_ty), mask=d_ok)


def cross_lavo_step(q, source: LavoSource, basis, rel_bias, mem_bias, *, window, start, scale=None):
    """`lavo_cross_decode` of one CC target position on Triton: q [B, 1, H, d] at position
    `start` (an int or a 0-dim long tensor on q's device) -> o [B, 1, H, d] in q's dtype.
    NotImplementedError for what it does not cover (float64)."""
    if source.means.dtype != torch.float32 or q.dtype == torch.float64:
        raise NotImplementedError("float64 decoding has no Triton kernel; use backend='torch'")
    batch, _, heads, dim = q.shape
    m, rank = source.keys.shape[2], basis.shape[1]
    scale = dim**-0.5 if scale is None else float(scale)
    on_device = isinstance(start, torch.Tensor)
    if on_device and (start.dim() != 0 or start.dtype != torch.long or start.device != q.device):
        raise ValueError(f"start: an int or a 0-dim long tensor on {q.device}, got {start.dtype} "
                         f"{tuple(start.shape)} on {start.device}")
    q1 = _ready(q[:, 0], q.dtype)  # [B, H, d]
    o = torch.empty_like(q1)
    # The source's tensors are read through their strides: beam search broadcasts one
    # source over a sequence's hypotheses (stride 0 in the batch), which a contiguous copy
    # would repeat at every step. Only the innermost dim must be dense.
    keys, values = _rows(source.keys), _rows(source.values)
    means, basis = _rows(source.means, torch.float32), _ready(basis, torch.float32)
    valid = _rows(source.valid, torch.float32)
    lavo_cross_step_kernel[(batch * heads,)](
        q1, keys, values, valid, means, basis,
        _ready(rel_bias, torch.float32), _ready(mem_bias, torch.float32), o,
        heads, m, start, scale,
        *keys.stride()[:3], *values.stride()[:3], *means.stride()[:3], valid.stride(0),
        P_ON_DEVICE=on_device, **_meta(dim, rank, window),
    )
    return o[:, None]


def _rows(x, dtype=None):
    """x in `dtype` (its own by default) with a dense innermost dim, keeping every other
    stride (a broadcast batch stays a view); a copy only when the dtype or the innermost
    stride differs."""
    dtype = x.dtype if dtype is None else dtype
    return x if x.dtype == dtype and x.stride(-1) == 1 else x.detach().to(dtype).contiguous()


@functools.lru_cache(maxsize=None)
def _meta(dim, rank, window):
    """The kernel's compile-time arguments for a head dim, rank and window."""
    blk = min(WINDOW_BLOCK, tile_width(window))
    return dict(D=dim, R=rank, BD=tile_width(dim), BR=tile_width(rank), W=window, BLK=blk,
                NBLK=cdiv(window, blk), num_warps=4)
