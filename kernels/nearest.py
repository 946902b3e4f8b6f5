"""Nearest-neighbour search between 3-D point clouds in one Triton kernel: `nearest_index`,
what point-cloud completion's Chamfer loss runs on CUDA tensors (its metrics search in
float64, by the matmul form).

The matmul form (tasks/pcc/geometry.py, `nearest_by_matmul`) writes a [B, n, m] matrix
of |b|^2 - 2 a.b in chunks, expands |b|^2 into it first and reads it again for the
argmin: three passes over n x m floats per cloud. Here each program holds BLOCK_N query
points in registers and streams the candidates past them BLOCK_M at a time, keeping for
every (query, lane) pair the smallest squared distance seen and its index; the one
reduction over the lanes comes at the end. Nothing of size n x m is written. Distances
are the squared differences summed in fp32: the matmul form's cancellation (|b|^2 and
2 a.b are both near 1 on unit-scale clouds, their difference is the small distance)
does not arise.
"""

import torch
import triton
import triton.language as tl

from .common import WHILE_LOOPS, cdiv

# The launch setting fastest at pcc's dense cab shape (16,384 points against 16,384) among 18
# timed (BLOCK_N and BLOCK_M 32-128, 4 or 8 warps; `benchmarks/pcc_geometry_cost.py`,
# docs/benchmarks.md "Point cloud completion (pcc)").
BLOCK_N = 32  # query points per program
BLOCK_M = 64  # candidates compared with them per step
WARPS = 4


@triton.jit
def _keep_nearer(best, best_index, start, b_cloud, ax, ay, az, M, lanes):
    """best, best_index [BLOCK_N, BLOCK_M] after the candidates start.. start + BLOCK_M - 1."""
    cols = start + lanes
    col_ok = cols < M
    # candidates past M sit at +inf: never nearer than a real one
    bx = tl.load(b_cloud + cols * 3, mask=col_ok, other=float("inf"))[None, :]
    by = tl.load(b_cloud + cols * 3 + 1, mask=col_ok, other=float("inf"))[None, :]
    bz = tl.load(b_cloud + cols * 3 + 2, mask=col_ok, other=float("inf"))[None, :]
    dx, dy, dz = ax - bx, ay - by, az - bz
    distance = dx * dx + dy * dy + dz * dz  # [BLOCK_N, BLOCK_M]
    nearer = distance < best  # strict: a lane keeps the first of equal distances
    return tl.where(nearer, distance, best), tl.where(nearer, cols[None, :], best_index)


@triton.jit
def _nearest_kernel(a_ptr, b_ptr, out_ptr, N, M, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    WHILE_LOOPS: tl.constexpr):
    """out[batch, i] = an index j of b's points minimising |a[batch, i] - b[batch, j]|^2,
    for a [B, N, 3] and b [B, M, 3] contiguous fp32 and out [B, N] int64."""
    batch = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    a_row = a_ptr + batch * N * 3 + rows * 3
    ax = tl.load(a_row, mask=row_ok, other=0.0)[:, None]
    ay = tl.load(a_row + 1, mask=row_ok, other=0.0)[:, None]
    az = tl.load(a_row + 2, mask=row_ok, other=0.0)[:, None]
    b_cloud = b_ptr + batch * M * 3
    lanes = tl.arange(0, BLOCK_M)
    best = tl.full([BLOCK_N, BLOCK_M], float("inf"), tl.float32)  # per (query, lane)
    best_index = tl.zeros([BLOCK_N, BLOCK_M], tl.int32)
    if WHILE_LOOPS:
        start = 0
        while start < M:
            best, best_index = _keep_nearer(best, best_index, start, b_cloud, ax, ay, az, M, lanes)
            start += BLOCK_M
    else:
        for start in range(0, M, BLOCK_M):
            best, best_index = _keep_nearer(best, best_index, start, b_cloud, ax, ay, az, M, lanes)
    lane = tl.argmin(best, axis=1)  # [BLOCK_N]
    picked = tl.sum(tl.where(lanes[None, :] == lane[:, None], best_index, 0), axis=1)
    tl.store(out_ptr + batch * N + rows, picked.to(tl.int64), mask=row_ok)


def nearest_index(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Indices [B, N] (int64) of the point of b [B, M, 3] nearest to each point of
    a [B, N, 3] (ties: any of the equally near), searched in fp32; no gradient. a and
    b on one device (CUDA, or the CPU under Triton's interpreter); M >= 1. Float64
    clouds raise NotImplementedError (the kernel compares in fp32). A candidate at a NaN
    distance is never kept, so a query with a NaN coordinate (or only NaN candidates)
    gets index 0, where the matmul form's argmin would pick a NaN."""
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        raise NotImplementedError("nearest_index searches in fp32; float64 clouds take the matmul form")
    if a.shape[0] != b.shape[0] or a.shape[-1] != 3 or b.shape[-1] != 3 or b.shape[1] == 0:
        raise ValueError(f"nearest_index: clouds {tuple(a.shape)} and {tuple(b.shape)}: [B, N, 3] and [B, M, 3] "
                         "with one B and M >= 1")
    batch, n, _ = a.shape
    out = torch.empty(batch, n, dtype=torch.long, device=a.device)
    if batch * n == 0:
        return out
    a = a.detach().float().contiguous()
    b = b.detach().float().contiguous()
    _nearest_kernel[(cdiv(n, BLOCK_N), batch)](a, b, out, n, b.shape[1], BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M,
                                               WHILE_LOOPS=WHILE_LOOPS, num_warps=WARPS)
    return out
