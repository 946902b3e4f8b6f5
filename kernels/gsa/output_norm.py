"""The GSA layer's output norm, RMSNorm(SiLU(o)) over each head's channels, fused in Triton.

`silu_rms_norm(x, weight, eps)`: y = n * weight with n = a / sqrt(mean(a^2) + eps) and
a = SiLU(x), along the last axis (a head's d channels). PyTorch's norm kernel takes one
row per thread block, which is slow for rows of d = 64 (docs/benchmarks.md, "Launch
settings and precisions"). Here a program takes ROWS rows at once; the backward
recomputes SiLU and the normalisation from x and the saved per-row 1/rms.

Forward and backward accumulate in fp32; y and dx are in x's dtype, dweight in weight's.
"""

import torch
import triton
import triton.language as tl

from ..common import cdiv, tile_width

ROWS = 64  # rows per program
MAX_DIM = 256


@triton.jit
def _rows(x_ptr, i_r, R, D, ROWS: tl.constexpr, BD: tl.constexpr):
    """Rows [i_r*ROWS, i_r*ROWS+ROWS) of a [R, D] tensor: offsets, mask and the fp32 tile."""
    rows = i_r * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    return offs, mask, tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, R, D, eps, ROWS: tl.constexpr, BD: tl.constexpr):
    i_r = tl.program_id(0)
    offs, mask, x = _rows(x_ptr, i_r, R, D, ROWS, BD)
    a = x * tl.sigmoid(x)
    rstd = 1.0 / tl.sqrt(tl.sum(a * a, 1) / D + eps)  # [ROWS]
    w = tl.load(w_ptr + tl.arange(0, BD), mask=tl.arange(0, BD) < D, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (a * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)
    rows = i_r * ROWS + tl.arange(0, ROWS)
    tl.store(rstd_ptr + rows, rstd, mask=rows < R)


@triton.jit
def _bwd_kernel(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, R, D, ROWS: tl.constexpr, BD: tl.constexpr):
    """dx for ROWS rows, and their share of dweight (row i_r of dw_ptr [programs, D])."""
    i_r = tl.program_id(0)
    offs, mask, x = _rows(x_ptr, i_r, R, D, ROWS, BD)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rows = i_r * ROWS + tl.arange(0, ROWS)
    rstd = tl.load(rstd_ptr + rows, mask=rows < R, other=0.0)
    cols = tl.arange(0, BD)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    sig = tl.sigmoid(x)
    n = x * sig * rstd[:, None]  # the normalised SiLU
    dn = dy * w[None, :]
    da = rstd[:, None] * (dn - n * (tl.sum(dn * n, 1) / D)[:, None])
    dx = da * sig * (1.0 + x * (1.0 - sig))  # SiLU'(x) = sig + x sig (1 - sig)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + i_r.to(tl.int64) * D + cols, tl.sum(dy * n, 0), mask=cols < D)


def silu_rms_norm_forward(x, weight, eps):
    """The forward kernel: x [..., d] -> (y like x, rstd [rows] fp32)."""
    d = x.shape[-1]
    x2 = x.contiguous().view(-1, d)  # [rows, d]
    rows = x2.shape[0]
    y = torch.empty_like(x2)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    _fwd_kernel[(cdiv(rows, ROWS),)](x2, weight, y, rstd, rows, d, eps, ROWS=ROWS, BD=tile_width(d))
    return y.view(x.shape), rstd


def silu_rms_norm_backward(dy, x, weight, rstd):
    """The backward kernel: -> (dx like x, dweight in weight's dtype)."""
    d = x.shape[-1]
    x2 = x.contiguous().view(-1, d)
    rows = x2.shape[0]
    programs = cdiv(rows, ROWS)
    dx = torch.empty_like(x2)
    dw_parts = torch.empty(programs, d, dtype=torch.float32, device=x2.device)
    _bwd_kernel[(programs,)](x2, weight, rstd, dy.contiguous().view(-1, d), dx, dw_parts, rows, d, ROWS=ROWS,
                             BD=tile_width(d))
    return dx.view(x.shape), dw_parts.sum(0).to(weight.dtype)


def silu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, use_triton: bool) -> torch.Tensor:
    """RMSNorm(SiLU(x)) * weight over the last axis, in x's dtype (fp32 accumulation).

    use_triton: the fused kernels (CUDA, or Triton's interpreter); else PyTorch's ops.
    Head dims over MAX_DIM take PyTorch's ops too.
    """
    if not use_triton or x.shape[-1] > MAX_DIM or x.dtype == torch.float64 or x.numel() == 0:
        return torch.nn.functional.rms_norm(torch.nn.functional.silu(x), (x.shape[-1],), weight.to(x.dtype), eps)
    from .op import silu_rms_norm_op  # (op.py registers the custom operators around the kernels)

    return silu_rms_norm_op(x, weight, float(eps))
