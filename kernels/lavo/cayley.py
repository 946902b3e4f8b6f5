"""(I - S)^-1 for a batch of skew-symmetric S, the solve inside LAVO's learned basis.

The Cayley map of a skew-symmetric A is (I - A/2)^-1 (I + A/2) = 2 (I - A/2)^-1 - I, so
the basis needs one inverse per head. cuSOLVER's batched solve of [H, 64, 64] takes many
small launches (a factorisation and triangular solves per matrix, forward and backward);
here one Triton program inverts one matrix in registers, all heads in one launch.

M = I - S with S skew-symmetric has the identity as its symmetric part, so xᵀMx = |x|²
for every x: M and every leading block of it are nonsingular, and Gauss-Jordan
elimination runs without pivoting, with growth bounded by M's own norm (Golub & Van
Loan, "Matrix Computations", §4.4, for matrices whose symmetric part is positive
definite). The inverse is computed in fp32.

`unit_skew_inverse(s)` is differentiable: W = (I - S)^-1 gives dW = W dS W, so the
gradient of S is Wᵀ G Wᵀ (two batched products, no second solve).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..common import tile_width

MAX_DIM = 128  # a [128, 128] fp32 matrix per program still fits the registers of 8 warps


@triton.jit
def _unit_skew_inverse_kernel(s_ptr, w_ptr, D: tl.constexpr, BD: tl.constexpr):
    """W = (I - S)^-1 for the matrix S [D, D] of this program (a row-major batch), by
    Gauss-Jordan elimination in place: step k scales row k by the pivot and eliminates
    column k from every other row, leaving column k of the inverse in its place. The
    padding beyond D is the identity, which the steps leave as it is."""
    offset = tl.program_id(0).to(tl.int64) * D * D
    idx = tl.arange(0, BD)
    rows, cols = idx[:, None], idx[None, :]
    inside = (rows < D) & (cols < D)
    s = tl.load(s_ptr + offset + rows * D + cols, mask=inside, other=0.0).to(tl.float32)
    a = tl.where(rows == cols, 1.0, 0.0) - s  # [BD, BD]
    for k in tl.static_range(D):
        row = tl.sum(tl.where(rows == k, a, 0.0), axis=0)  # a[k, :]
        col = tl.sum(tl.where(cols == k, a, 0.0), axis=1)  # a[:, k]
        pivot = tl.sum(tl.where(idx == k, row, 0.0), axis=0)
        scaled = tl.where(idx == k, 1.0, row) / pivot  # the new row k; its entry k is 1 / pivot
        a = tl.where(cols == k, 0.0, a) - col[:, None] * scaled[None, :]  # column k becomes -a[:, k] / pivot
        a = tl.where(rows == k, scaled[None, :], a)
    tl.store(w_ptr + offset + rows * D + cols, a, mask=inside)


@torch.library.custom_op("lavo_tasks::unit_skew_inverse", mutates_args=())
def _inverse_op(s: Tensor) -> Tensor:
    """s [N, d, d] fp32, skew-symmetric -> (I - s)^-1 [N, d, d] fp32."""
    s = s.contiguous()
    w = torch.empty_like(s)
    dim = s.shape[-1]
    width = tile_width(dim)
    _unit_skew_inverse_kernel[(s.shape[0],)](s, w, dim, BD=width, num_warps=4 if width <= 64 else 8)
    return w


@_inverse_op.register_fake
def _(s):
    return torch.empty(s.shape, dtype=s.dtype, device=s.device)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    (w,) = ctx.saved_tensors
    wt = w.transpose(-1, -2)
    return wt @ grad @ wt


torch.library.register_autograd("lavo_tasks::unit_skew_inverse", _backward, setup_context=_setup)


def unit_skew_inverse(s: Tensor) -> Tensor:
    """(I - s)^-1 for s [N, d, d] skew-symmetric, in one Triton launch (CUDA, or Triton's
    interpreter on the CPU). Raises NotImplementedError for what the kernel does not
    cover (not fp32, d > MAX_DIM), for the caller's PyTorch fallback."""
    if s.dtype != torch.float32 or s.shape[-1] > MAX_DIM:
        raise NotImplementedError(f"unit_skew_inverse takes fp32 matrices of at most {MAX_DIM} rows, "
                                  f"got {s.dtype} {tuple(s.shape)}")
    return _inverse_op(s)
