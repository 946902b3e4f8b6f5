"""Farthest point sampling in one Triton kernel: `farthest_point_indices`, what pcc's
model runs on CUDA clouds (tasks/pcc/geometry.py's `farthest_point_sample`).

The PyTorch loop it replaces there launches about seven kernels per sample drawn (the
latest sample's point, the differences, their squares and sums, the running minimum, its
argmax and the write of the index): 127 samples of the cab preset's 128 are about 900
launches a step.
Here one program per cloud holds the cloud's points and each point's squared distance to
the nearest sample in registers and draws every sample in a loop; it reads the latest
sample's coordinates back from the cloud in memory.
"""

import torch
import triton
import triton.language as tl

from .common import WHILE_LOOPS, next_pow2

MAX_POINTS = 16384  # points of a cloud the kernel holds in registers (16 warps at the most)


def warps(block: int) -> int:
    """The launch's warps for a cloud of `block` (a power of 2) lanes: 4, or one per 512
    lanes up to 16 (`benchmarks/pcc_geometry_cost.py --only fps` sweeps them)."""
    return max(4, min(16, block // 512))


@triton.jit
def _draw(nearest, last, cloud, x, y, z):
    """(nearest, the next sample's index) after the sample at index `last`."""
    dx = x - tl.load(cloud + last * 3)
    dy = y - tl.load(cloud + last * 3 + 1)
    dz = z - tl.load(cloud + last * 3 + 2)
    nearest = tl.minimum(nearest, dx * dx + dy * dy + dz * dz)
    return nearest, tl.argmax(nearest, axis=0, tie_break_left=True)  # the lowest index among equally far points


@triton.jit
def _fps_kernel(points_ptr, out_ptr, N, S, BLOCK: tl.constexpr, WHILE_LOOPS: tl.constexpr):
    """out[b, :S] = the farthest point samples of points[b] ([B, N, 3] contiguous fp32),
    starting at point 0."""
    batch = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    ok = lanes < N
    cloud = points_ptr + batch * N * 3
    x = tl.load(cloud + lanes * 3, mask=ok, other=0.0)
    y = tl.load(cloud + lanes * 3 + 1, mask=ok, other=0.0)
    z = tl.load(cloud + lanes * 3 + 2, mask=ok, other=0.0)
    # lanes past N hold -1: below every distance, so argmax never picks them
    nearest = tl.where(ok, float("inf"), -1.0)
    last = tl.full((), 0, tl.int32)  # sample 0 is point 0 (int32, as argmax returns)
    out = out_ptr + batch * S
    tl.store(out, last.to(tl.int64))
    if WHILE_LOOPS:
        i = 1
        while i < S:
            nearest, last = _draw(nearest, last, cloud, x, y, z)
            tl.store(out + i, last.to(tl.int64))
            i += 1
    else:
        for i in range(1, S):
            nearest, last = _draw(nearest, last, cloud, x, y, z)
            tl.store(out + i, last.to(tl.int64))


def farthest_point_indices(points: torch.Tensor, n_samples: int) -> torch.Tensor:
    """`geometry.farthest_point_sample` in one launch: indices [B, n_samples] (int64) of a
    greedy farthest point sampling of points [B, N, 3], from point 0, the lowest index
    among equally far points, distances in fp32. Float64 clouds and clouds of more than
    MAX_POINTS points raise NotImplementedError. Clouds with NaN coordinates are not
    supported: the GPU's minimum drops a NaN where the loop keeps it, so their samples
    differ."""
    if points.dim() != 3 or points.shape[-1] != 3:
        raise ValueError(f"farthest_point_indices: points {tuple(points.shape)}: [B, N, 3] expected")
    batch, n_points, _ = points.shape
    if not 1 <= n_samples <= n_points:
        raise ValueError(f"farthest_point_indices: n_samples={n_samples} must be in [1, {n_points}]")
    if points.dtype == torch.float64:
        raise NotImplementedError("farthest_point_indices compares in fp32; float64 clouds take the PyTorch loop")
    if n_points > MAX_POINTS:
        raise NotImplementedError(f"farthest_point_indices holds at most {MAX_POINTS} points a cloud, not {n_points}")
    out = torch.empty(batch, n_samples, dtype=torch.long, device=points.device)
    if batch == 0:
        return out
    block = next_pow2(n_points)
    _fps_kernel[(batch,)](points.detach().float().contiguous(), out, n_points, n_samples, BLOCK=block,
                          WHILE_LOOPS=WHILE_LOOPS, num_warps=warps(block))
    return out
