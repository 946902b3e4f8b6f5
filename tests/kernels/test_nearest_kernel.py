"""The nearest-neighbour kernel (kernels/nearest.py) against a float64 search over every
pair, on the CPU through Triton's interpreter; on a GPU, pcc's Chamfer distances through
the kernel against the same search."""

import pytest
import torch

from lavo_tasks.kernels.nearest import BLOCK_M, BLOCK_N, nearest_index
from lavo_tasks.tasks.pcc.geometry import chamfer_squared
from nearest_reference import brute_nearest_squared, squared_at


# sizes around the blocks: one partial block, exact blocks, several blocks and a remainder
@pytest.mark.parametrize("n, m", [(1, 1), (5, 3), (BLOCK_N, BLOCK_M), (2 * BLOCK_N + 7, 3 * BLOCK_M + 11)])
def test_the_kernel_finds_the_nearest_point(n, m):
    g = torch.Generator().manual_seed(n + m)
    a, b = torch.rand(2, n, 3, generator=g), torch.rand(2, m, 3, generator=g)
    index = nearest_index(a, b)
    assert index.shape == (2, n) and index.dtype == torch.long
    assert bool(((index >= 0) & (index < m)).all())
    # fp32 differences of points in [0, 1): within a few ulps of the float64 minimum
    torch.testing.assert_close(squared_at(a, b, index), brute_nearest_squared(a, b), rtol=1e-6, atol=1e-12)


def test_points_in_both_clouds_and_ties():
    g = torch.Generator().manual_seed(3)
    m = 2 * BLOCK_M + 2  # candidate blocks: two whole ones and two candidates
    a, b = torch.rand(2, 150, 3, generator=g), torch.rand(2, m, 3, generator=g)
    # one cloud with copies of a point in every block and in several lanes: ties
    copies = [5, BLOCK_M - 1, BLOCK_M + 3, BLOCK_M + 5, 2 * BLOCK_M + 1]
    b[1, copies] = b[1, 5].clone()
    a[:, :40] = b[:, m - 40:]  # a's first 40 points are b's last 40, spanning the blocks' ends
    a[1, 40] = b[1, 5]
    index = nearest_index(a, b)
    assert index[0, :40].tolist() == list(range(m - 40, m))
    for i in range(40):  # the same point, or a copy of it
        j = m - 40 + i
        assert index[1, i].item() in (copies if j in copies else [j])
    assert index[1, 40].item() in copies
    torch.testing.assert_close(squared_at(a, b, index), brute_nearest_squared(a, b), rtol=1e-6, atol=1e-12)


def test_the_kernel_takes_views_and_half_precision():
    g = torch.Generator().manual_seed(5)
    a = torch.rand(3, 70, 2, generator=g).transpose(0, 2)  # [2, 70, 3], not contiguous
    b = torch.rand(2, 90, 3, generator=g).to(torch.bfloat16)
    index = nearest_index(a, b)
    torch.testing.assert_close(squared_at(a, b.float(), index), brute_nearest_squared(a, b.float()),
                               rtol=1e-6, atol=1e-12)


def test_far_candidates_do_not_hide_a_near_one():
    """Clouds 1e-3 wide at 100 from the origin: the differences of nearby coordinates are
    exact in fp32, so each point of a finds itself in b, where the matmul form's
    |b|^2 - 2 a.b (about 3e4, rounded by about 2e-3) would lose distances near 1e-8."""
    g = torch.Generator().manual_seed(6)
    b = torch.rand(1, 200, 3, generator=g) * 1e-3 + 100.0
    a = b[:, ::2].clone()
    index = nearest_index(a, b)
    assert index[0].tolist() == list(range(0, 200, 2))


def test_empty_queries_and_bad_clouds():
    assert nearest_index(torch.rand(2, 0, 3), torch.rand(2, 4, 3)).shape == (2, 0)
    for a_shape, b_shape in [((2, 4, 3), (1, 4, 3)), ((1, 4, 2), (1, 4, 2)), ((1, 4, 3), (1, 0, 3))]:
        with pytest.raises(ValueError, match="nearest_index: clouds"):
            nearest_index(torch.rand(a_shape), torch.rand(b_shape))
    with pytest.raises(NotImplementedError, match="fp32"):
        nearest_index(torch.rand(1, 4, 3, dtype=torch.float64), torch.rand(1, 4, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_chamfer_on_cuda_matches_the_full_search():
    g = torch.Generator().manual_seed(7)
    prediction = torch.rand(4, 3000, 3, generator=g).cuda()
    truth = torch.rand(4, 5000, 3, generator=g).cuda()
    d1, d2 = chamfer_squared(prediction, truth)
    torch.testing.assert_close(d1.double(), brute_nearest_squared(prediction, truth), rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(d2.double(), brute_nearest_squared(truth, prediction), rtol=1e-5, atol=1e-12)
    index = nearest_index(prediction, truth)
    torch.testing.assert_close(squared_at(prediction, truth, index), brute_nearest_squared(prediction, truth),
                               rtol=1e-6, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp32_cuda_clouds_take_the_kernel_and_float64_ones_or_backend_torch_the_matmul_form(monkeypatch):
    from lavo_tasks.kernels import nearest
    from lavo_tasks.tasks.pcc import geometry
    calls, kernel, matmul = [], nearest.nearest_index, geometry.nearest_by_matmul
    monkeypatch.setattr(nearest, "nearest_index", lambda a, b: calls.append("kernel") or kernel(a, b))
    monkeypatch.setattr(geometry, "nearest_by_matmul",
                        lambda a, b, max_elements=None: calls.append("matmul") or matmul(a, b, max_elements))
    a, b = torch.rand(1, 50, 3, device="cuda"), torch.rand(1, 60, 3, device="cuda")
    geometry.nearest_squared_distances(a, b)
    geometry.nearest_squared_distances(a.double(), b.double())
    monkeypatch.setenv("LAVO_TASKS_BACKEND", "torch")  # as for the attention ops: the PyTorch forms
    geometry.nearest_squared_distances(a, b)
    assert calls == ["kernel", "matmul", "matmul"]
