"""The farthest-point-sampling kernel (kernels/fps.py) against pcc's PyTorch loop in
float64 (itself checked point by point against a brute-force search in
tests/tasks/pcc/test_pcc_geometry.py), on the CPU through Triton's interpreter and on a GPU."""

import pytest
import torch

from lavo_tasks.kernels.fps import MAX_POINTS, farthest_point_indices
from lavo_tasks.tasks.pcc.geometry import farthest_point_sample


@pytest.mark.parametrize("n_points, n_samples", [(1, 1), (7, 7), (40, 9), (300, 64)])
def test_the_kernel_draws_the_farthest_points(n_points, n_samples):
    points = torch.rand(3, n_points, 3, generator=torch.Generator().manual_seed(n_points))
    index = farthest_point_indices(points, n_samples)
    assert index.shape == (3, n_samples) and index.dtype == torch.long
    assert torch.equal(index, farthest_point_sample(points.double(), n_samples))


def grids(device: str = "cpu") -> torch.Tensor:
    """[3, 25, 3]: a 5 x 5 grid of integer points, flipped, and with duplicates: every
    distance is exact in fp32 and float64, so the two have the same (many) ties."""
    grid = torch.cartesian_prod(torch.arange(5.0), torch.arange(5.0), torch.zeros(1))  # [25, 3]
    return torch.stack([grid, grid.flip(0), torch.cat([grid[:3], grid[:3], grid[6:]])]).to(device)


def test_equally_far_points_give_the_lowest_index():
    """(Under the interpreter, Triton's argmax is numpy's; the GPU test below runs the
    compiled reduction on the same ties.)"""
    points = grids()
    index = farthest_point_indices(points, 12)
    assert torch.equal(index, farthest_point_sample(points.double(), 12))
    assert index[0, :4].tolist() == [0, 24, 4, 20]  # the grid's corners, the lowest index on ties


def test_the_kernel_takes_views_and_half_precision():
    g = torch.Generator().manual_seed(2)
    points = torch.rand(3, 50, 2, generator=g).transpose(0, 2)  # [2, 50, 3], not contiguous
    assert torch.equal(farthest_point_indices(points, 10), farthest_point_sample(points.double(), 10))
    half = torch.rand(2, 50, 3, generator=g).to(torch.bfloat16)
    assert torch.equal(farthest_point_indices(half, 10), farthest_point_sample(half.double(), 10))


def test_bad_requests():
    points = torch.rand(2, 5, 3)
    for n_samples in (0, 6):
        with pytest.raises(ValueError, match=f"n_samples={n_samples} must be in \\[1, 5\\]"):
            farthest_point_indices(points, n_samples)
    with pytest.raises(ValueError, match="\\[B, N, 3\\] expected"):
        farthest_point_indices(torch.rand(2, 5, 2), 2)
    with pytest.raises(NotImplementedError, match="fp32"):
        farthest_point_indices(points.double(), 2)
    with pytest.raises(NotImplementedError, match=f"at most {MAX_POINTS} points"):
        farthest_point_indices(torch.zeros(1, MAX_POINTS + 1, 3), 2)
    assert farthest_point_indices(torch.rand(0, 5, 3), 2).shape == (0, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch, n_points, n_samples", [(32, 2048, 128), (4, 16384, 64), (3, 1000, 1000)])
def test_on_cuda_the_kernel_draws_what_the_loop_draws(batch, n_points, n_samples):
    g = torch.Generator().manual_seed(n_points)
    points = torch.rand(batch, n_points, 3, generator=g).cuda()
    assert torch.equal(farthest_point_indices(points, n_samples), farthest_point_sample(points.double(), n_samples))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_equally_far_points_give_the_lowest_index():
    points = grids("cuda")
    assert torch.equal(farthest_point_indices(points, 25).cpu(), farthest_point_sample(points.double().cpu(), 25))
