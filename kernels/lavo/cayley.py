"""(I - S)^-1 for a batch of skew-symmetric S, the solve inside LAVO's learned basis.

The Cayley map of a skew-symmetric A is (I - A/2)^-1 (I + A/2) = 2 (I - A/2)^-1 - I, so
the basis needs one inverse per head. cuSOLVER's batched solve of [H, 64, 64] takes many
small launches (a factorisation and triangular solves per matrix, forward and backward);
here one Triton program inverts one matrix in registers, all heads in one launch, by
Gauss-Jordan elimination in blocks of PIVOT_BLOCK pivots: the sequential steps run on a
[16, 16] tile, and eliminating a block from the whole matrix is two products (fp32,
`input_precision="ieee"`).

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

from ..common import MIN_DOT, tile_width

MAX_DIM = 128  # the widest matrix: a [128, 128] fp32 tile per program, on 8 warps


PIVOT_BLOCK = MIN_DOT  # pivots eliminated together: tl.dot's smallest width


@triton.jit
def _gauss_jordan(a, B: tl.constexpr):
    """The inverse of the register tile a [B, B], by Gauss-Jordan elimination in place:
    step k scales row k by the pivot and eliminates column k from every other row,
    leaving column k of the inverse in its place."""
    idx = tl.arange(0, B)
    rows, cols = idx[:, None], idx[None, :]
    for k in tl.static_range(B):
        row = tl.sum(tl.where(rows == k, a, 0.0), axis=0)  # a[k, :]
        col = tl.sum(tl.where(cols == k, a, 0.0), axis=1)  # a[:, k]
        pivot = tl.sum(tl.where(idx == k, row, 0.0), axis=0)
        scaled = tl.where(idx == k, 1.0, row) / pivot  # the new row k; its entry k is 1 / pivot
        a = tl.where(cols == k, 0.0, a) - col[:, None] * scaled[None, :]  # column k becomes -a[:, k] / pivot
        a = tl.where(rows == k, scaled[None, :], a)
    return a


@triton.jit
def _unit_skew_inverse_kernel(s_ptr, w_ptr, D: tl.constexpr, BD: tl.constexpr, B: tl.constexpr):
    """W = (I - S)^-1 for the matrix S [D, D] of this program (a row-major batch), by
    Gauss-Jordan elimination in blocks of B pivots, in place. For the pivots K of a
    block, with Q = A[K, K], P = A[:, K], R = A[K, :], one block step is

        A[i, j] <- A[i, j] - P[i] Q^-1 R[j]    (i, j not in K)
        A[K, j] <- Q^-1 R[j]                   (j not in K)
        A[i, K] <- -P[i] Q^-1                  (i not in K)
        A[K, K] <- Q^-1

    that is A <- E + Z R', with E = A outside the rows and columns K, Z = -P Q^-1 with its
    rows K replaced by Q^-1, and R' = R with its columns K replaced by the identity. Per
    block, Q^-1 takes B sequential steps on a [B, B] tile and the rest is two products;
    R, P and Q come out of the tile by masked sums. The padding beyond D is the identity,
    which no block changes, so the blocks stop at D."""
    offset = tl.program_id(0).to(tl.int64) * D * D
    idx = tl.arange(0, BD)
    rows, cols = idx[:, None], idx[None, :]
    inside = (rows < D) & (cols < D)
    s = tl.load(s_ptr + offset + rows * D + cols, mask=inside, other=0.0).to(tl.float32)
    a = tl.where(rows == cols, 1.0, 0.0) - s  # [BD, BD]
    pivots = tl.arange(0, B)
    for first in tl.static_range(0, D, B):
        in_k = (idx >= first) & (idx < first + B)
        eye_k = tl.where(idx[:, None] == pivots[None, :] + first, 1.0, 0.0)  # [BD, B]: rows K hold the identity
        # rows K of A: [BD, BD] -> [BD / B, B, BD], summed over the blocks (only block K is nonzero)
        r = tl.sum(tl.reshape(tl.where(in_k[:, None], a, 0.0), [BD // B, B, BD]), axis=0)  # [B, BD]
        p = tl.sum(tl.reshape(tl.where(in_k[None, :], a, 0.0), [BD, BD // B, B]), axis=1)  # [BD, B]
        q = tl.sum(tl.reshape(tl.where(in_k[None, :], r, 0.0), [B, BD // B, B]), axis=1)  # [B, B]
        z = tl.dot(tl.where(in_k[:, None], eye_k, -p), _gauss_jordan(q, B), input_precision="ieee")  # [BD, B]
        r = tl.where(in_k[None, :], tl.trans(eye_k), r)
        a = tl.dot(z, r, acc=tl.where(in_k[:, None] | in_k[None, :], 0.0, a), input_precision="ieee")
    tl.store(w_ptr + offset + rows * D + cols, a, mask=inside)


@torch.library.custom_op("lavo_tasks::unit_skew_inverse", mutates_args=())
def _inverse_op(s: Tensor) -> Tensor:
    """s [N, d, d] fp32, skew-symmetric -> (I - s)^-1 [N, d, d] fp32."""
    s = s.contiguous()
    w = torch.empty_like(s)
    dim = s.shape[-1]
    width = tile_width(dim)
    _unit_skew_inverse_kernel[(s.shape[0],)](s, w, dim, BD=width, B=PIVOT_BLOCK, num_warps=4 if width <= 64 else 8)
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
