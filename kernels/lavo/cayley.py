"""(I - S)^-1 for a batch of skew-symmetric S, the solve inside LAVO's learned basis.

The Cayley map of a skew-symmetric A is (I - A/2)^-1 (I + A/2) = 2 (I - A/2)^-1 - I, so
the basis needs one inverse per head. cuSOLVER's batched solve of [H, 64, 64] takes many
small launches (a factorisation and triangular solves per matrix, forward and backward);
here one Triton program inverts one matrix, all heads in one launch, by
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

MAX_DIM = 128  # the widest matrix inverted by the kernel


PIVOT_BLOCK = MIN_DOT  # pivots eliminated together: tl.dot's smallest width
ROW_BLOCK = 32  # rows of the matrix updated together


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
def _unit_skew_inverse_kernel(s_ptr, w_ptr, D: tl.constexpr, BD: tl.constexpr, B: tl.constexpr,
                              RB: tl.constexpr):
    """W = (I - S)^-1 for the matrix S [D, D] of this program (a row-major batch), by
    Gauss-Jordan elimination in blocks of B pivots, in place in W. For the pivots K of a
    block, with Q = A[K, K], P = A[:, K], R = A[K, :], one block step is

        A[i, j] <- A[i, j] - P[i] Q^-1 R[j]    (i, j not in K)
        A[K, j] <- Q^-1 R[j]                   (j not in K)
        A[i, K] <- -P[i] Q^-1                  (i not in K)
        A[K, K] <- Q^-1

    that is A <- E + Z R', with E = A outside the rows and columns K, Z = -P Q^-1 with its
    rows K replaced by Q^-1, and R' = R with its columns K replaced by the identity. Per
    block, Q^-1 takes B sequential steps on a [B, B] tile; then the matrix is updated RB
    rows at a time (two products each), so no [BD, BD] tile is ever held in registers,
    and the loops over blocks and rows stay loops (unrolled, they spill registers). A
    barrier separates the reads of a block's rows K from the writes of its update, and
    its update from the next block's reads. Where D < BD the missing pivots of the last
    block are the identity, which couples to nothing."""
    offset = tl.program_id(0).to(tl.int64) * D * D
    base, w_base = s_ptr + offset, w_ptr + offset
    cols = tl.arange(0, BD)[None, :]  # [1, BD]
    chunk = tl.arange(0, RB)[:, None]  # [RB, 1]
    for first in range(0, D, RB):  # W <- I - S
        rows = first + chunk
        inside = (rows < D) & (cols < D)
        s = tl.load(base + rows * D + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(w_base + rows * D + cols, tl.where(rows == cols, 1.0, 0.0) - s, mask=inside)
    tl.debug_barrier()
    pivots = tl.arange(0, B)
    for first in range(0, D, B):
        k_rows, k_cols = first + pivots[:, None], first + pivots[None, :]  # [B, 1], [1, B]
        q = tl.load(w_base + k_rows * D + k_cols, mask=(k_rows < D) & (k_cols < D), other=0.0)
        q_inv = _gauss_jordan(tl.where((k_rows >= D) & (k_rows == k_cols), 1.0, q), B)  # [B, B]
        r = tl.load(w_base + k_rows * D + cols, mask=(k_rows < D) & (cols < D), other=0.0)  # [B, BD]
        in_k = (cols >= first) & (cols < first + B)
        r = tl.where(in_k, tl.where(k_rows == cols, 1.0, 0.0), r)  # R'
        tl.debug_barrier()  # rows K read by every thread before any is written
        for top in range(0, D, RB):
            rows = top + chunk
            inside = (rows < D) & (cols < D)
            a = tl.load(w_base + rows * D + cols, mask=inside, other=0.0)  # [RB, BD]
            p = tl.load(w_base + rows * D + k_cols, mask=(rows < D) & (k_cols < D), other=0.0)  # [RB, B]
            row_in_k = (rows >= first) & (rows < first + B)
            z = tl.dot(tl.where(row_in_k, tl.where(rows == k_cols, 1.0, 0.0), -p), q_inv, input_precision="ieee")
            a = tl.dot(z, r, acc=tl.where(row_in_k | in_k, 0.0, a), input_precision="ieee")
            tl.store(w_base + rows * D + cols, a, mask=inside)
        tl.debug_barrier()  # the block's update written before the next block reads


def launch_inverse(s: Tensor, w: Tensor, *, num_warps: int | None = None, rows: int = ROW_BLOCK) -> None:
    """W = (I - s)^-1 written into w, both contiguous [N, d, d] fp32: the kernel's launch
    (4 warps up to 64-wide tiles, else 8), or other warps and row blocks."""
    dim = s.shape[-1]
    width = tile_width(dim)
    num_warps = (4 if width <= 64 else 8) if num_warps is None else num_warps
    _unit_skew_inverse_kernel[(s.shape[0],)](s, w, dim, BD=width, B=PIVOT_BLOCK, RB=rows, num_warps=num_warps)


@torch.library.custom_op("lavo_tasks::unit_skew_inverse", mutates_args=())
def _inverse_op(s: Tensor) -> Tensor:
    """s [N, d, d] fp32, skew-symmetric -> (I - s)^-1 [N, d, d] fp32."""
    s = s.contiguous()
    w = torch.empty_like(s)
    launch_inverse(s, w)
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
