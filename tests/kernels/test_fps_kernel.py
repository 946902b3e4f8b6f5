"""The farthest-point-sampling kernel (kernels/fps.py) against pcc's PyTorch loop in
float64 (itself checked point by point against a brute-force search in
tests/tasks/pcc/test_pcc_geometry.py), on the CPU through Triton's interpreter and on a GPU."""

import sys

import pytest
import torch

from lavo_tasks.kernels.fps import MAX_POINTS, farthest_point_indices
from lavo_tasks.tasks.pcc.geometry import farthest_point_sample_by_kernel, farthest_point_sample_by_loop


@pytest.mark.parametrize("n_points, n_samples", [(1, 1), (7, 7), (40, 9), (300, 64)])
def test_the_kernel_draws_the_farthest_points(n_points, n_samples):
    points = torch.rand(3, n_points, 3, generator=torch.Generator().manual_seed(n_points))
    index = farthest_point_indices(points, n_samples)
    assert index.shape == (3, n_samples) and index.dtype == torch.long
    assert torch.equal(index, farthest_point_sample_by_loop(points.double(), n_samples))


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
    assert torch.equal(index, farthest_point_sample_by_loop(points.double(), 12))
    assert index[0, :4].tolist() == [0, 24, 4, 20]  # the grid's corners, the lowest index on ties


def test_the_kernel_takes_views_and_half_precision():
    g = torch.Generator().manual_seed(2)
    points = torch.rand(3, 50, 2, generator=g).transpose(0, 2)  # [2, 50, 3], not contiguous
    assert torch.equal(farthest_point_indices(points, 10), farthest_point_sample_by_loop(points.double(), 10))
    half = torch.rand(2, 50, 3, generator=g).to(torch.bfloat16)
    assert torch.equal(farthest_point_indices(half, 10), farthest_point_sample_by_loop(half.double(), 10))


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


def test_pcc_samples_through_the_kernel_and_falls_back_to_the_loop(monkeypatch):
    g = torch.Generator().manual_seed(4)
    points = torch.rand(2, 60, 3, generator=g)
    assert torch.equal(farthest_point_sample_by_kernel(points, 8), farthest_point_sample_by_loop(points.double(), 8))
    big = torch.rand(1, MAX_POINTS + 1, 3, generator=g)
    with pytest.warns(RuntimeWarning, match=f"farthest_point_sample_by_kernel: .*at most {MAX_POINTS} points"):
        assert torch.equal(farthest_point_sample_by_kernel(big, 3), farthest_point_sample_by_loop(big, 3))
    monkeypatch.setitem(sys.modules, "lavo_tasks.kernels.fps", None)  # its import now fails
    with pytest.warns(RuntimeWarning, match="farthest_point_sample_by_kernel: Triton path unavailable"):
        assert torch.equal(farthest_point_sample_by_kernel(points, 8), farthest_point_sample_by_loop(points, 8))


def test_compiled_sampling_takes_the_kernel_as_one_operator(monkeypatch):
    """While torch.compile traces, the kernel path is the custom operator: a fullgraph
    compile of `farthest_point_sample` (the eager backend on the CPU, the kernel through
    the interpreter, `on_kernels` forced true) neither breaks the graph nor changes a
    sample. opcheck tests the operator's schema and fake."""
    from lavo_tasks.tasks.pcc import geometry
    points = torch.rand(2, 60, 3, generator=torch.Generator().manual_seed(6))
    torch.library.opcheck(geometry.farthest_point_sample_op, (points, 8),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    monkeypatch.setattr(geometry, "on_kernels", lambda *clouds: True)
    compiled = torch.compile(geometry.farthest_point_sample, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(points, 8), farthest_point_sample_by_loop(points.double(), 8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("batch, n_points, n_samples", [(32, 2048, 128), (4, 16384, 64), (3, 1000, 1000)])
def test_on_cuda_the_kernel_draws_what_the_loop_draws(batch, n_points, n_samples):
    g = torch.Generator().manual_seed(n_points)
    points = torch.rand(batch, n_points, 3, generator=g).cuda()
    reference = farthest_point_sample_by_loop(points.double(), n_samples)
    assert torch.equal(farthest_point_indices(points, n_samples), reference)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_equally_far_points_give_the_lowest_index():
    points = grids("cuda")
    reference = farthest_point_sample_by_loop(points.double().cpu(), 25)
    assert torch.equal(farthest_point_indices(points, 25).cpu(), reference)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp32_cuda_clouds_take_the_kernel_and_float64_ones_or_backend_torch_the_loop(monkeypatch):
    from lavo_tasks.kernels import fps
    from lavo_tasks.tasks.pcc import geometry
    calls, kernel, loop = [], fps.farthest_point_indices, geometry.farthest_point_sample_by_loop
    monkeypatch.setattr(fps, "farthest_point_indices", lambda p, n: calls.append("kernel") or kernel(p, n))
    monkeypatch.setattr(geometry, "farthest_point_sample_by_loop", lambda p, n: calls.append("loop") or loop(p, n))
    points = torch.rand(2, 70, 3, device="cuda")
    assert torch.equal(geometry.farthest_point_sample(points, 9), loop(points.double(), 9))
    geometry.farthest_point_sample(points.double(), 9)
    monkeypatch.setenv("LAVO_TASKS_BACKEND", "torch")  # as for the attention ops: the PyTorch forms
    geometry.farthest_point_sample(points, 9)
    assert calls == ["kernel", "loop", "loop"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_sampling_is_one_graph_and_draws_the_same_points():
    """Inductor keeps the kernel's custom operator as one node, so pcc's compiled forward
    stays one graph."""
    from lavo_tasks.tasks.pcc.geometry import farthest_point_sample
    points = torch.rand(4, 300, 3, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    compiled = torch.compile(farthest_point_sample, fullgraph=True)
    assert torch.equal(compiled(points, 20), farthest_point_sample_by_loop(points.double(), 20))
