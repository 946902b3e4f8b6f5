"""Rotary position embedding fused in Triton: `rope_op`, what `attention.rope.apply_rope`
runs on CUDA tensors in eager calls.

The PyTorch form of the rotation (attention/rope.py) launches about 30 kernels per tensor,
forward and backward (the angle table, the fp32 cast, four products, the halves' slices,
their concatenation and the gradients of each); a self-attention layer rotates its
queries and its keys. Here
one kernel rotates a [B, T, H, d] tensor and the backward is the same kernel rotating the
gradient back (a rotation's transpose is the rotation by minus the angle). The angles
are position * inv_freq in fp32, inv_freq the PyTorch form's own fp32 table (the caller
passes it), so both round the same angles; their cosines and sines may differ in the
last bit.
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from .common import cdiv, next_pow2

ROWS = 32  # (position, head) rows per program


@triton.jit(do_not_specialize=["offset"])  # one compiled kernel for every decode position
def _rope_kernel(x_ptr, y_ptr, inv_freq_ptr, R, T, H, D, HALF, offset, SIGN: tl.constexpr, ROWS: tl.constexpr,
                 BH: tl.constexpr, ODD: tl.constexpr):
    """y = rotation of x by SIGN * angle for ROWS rows of a contiguous [B*T*H, D] tensor:
    channel c < HALF pairs with c + HALF; channel 2 * HALF (odd D) is copied."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BH)
    row_ok = rows < R
    mask = row_ok[:, None] & (cols < HALF)[None, :]
    position = ((rows // H) % T + offset).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + cols, mask=cols < HALF, other=0.0)
    angle = position[:, None] * inv_freq[None, :]  # [ROWS, BH]
    cos, sin = tl.cos(angle), SIGN * tl.sin(angle)
    base = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x1 = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base, (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + base + HALF, (x1 * sin + x2 * cos).to(y_ptr.dtype.element_ty), mask=mask)
    if ODD:
        last = rows.to(tl.int64) * D + D - 1
        tl.store(y_ptr + last, tl.load(x_ptr + last, mask=row_ok), mask=row_ok)


def rope_rotate(x: torch.Tensor, offset: int, inv_freq: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [B, T, H, d] rotated as at positions offset.. (inverse: rotated back), in x's
    dtype; inv_freq [d // 2] fp32 on x's device: each channel pair's angle per position."""
    batch, length, heads, d = x.shape
    half = d // 2
    x = x.contiguous()
    y = torch.empty_like(x)
    rows = batch * length * heads
    if rows == 0:
        return y
    _rope_kernel[(cdiv(rows, ROWS),)](
        x, y, inv_freq, rows, length, heads, d, half, offset,
        SIGN=-1.0 if inverse else 1.0, ROWS=ROWS, BH=next_pow2(max(half, 1)), ODD=d % 2 == 1, num_warps=4)
    return y


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offset, inv_freq):
        ctx.offset, ctx.inv_freq = offset, inv_freq
        return rope_rotate(x, offset, inv_freq)

    @staticmethod
    @once_differentiable  # (a double backward raises rather than returning a detached gradient)
    def backward(ctx, dy):
        return rope_rotate(dy, ctx.offset, ctx.inv_freq, inverse=True), None, None


def rope_op(x: torch.Tensor, offset: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, d] rotated as at positions offset.., offset + T - 1, differentiable
    (inv_freq as `rope_rotate` takes it)."""
    return _Rope.apply(x, offset, inv_freq)
