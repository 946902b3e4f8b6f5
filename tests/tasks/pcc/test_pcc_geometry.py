"""FPS and kNN against brute-force loops; Chamfer and F-score against hand-computed values."""

import math
import sys

import pytest
import torch

from lavo_tasks.tasks.pcc.geometry import (chamfer_l1_loss, chamfer_squared, farthest_point_sample, gather_points,
                                           knn, nearest_by_kernel, nearest_by_matmul, nearest_by_tree,
                                           nearest_squared_distances)
from lavo_tasks.tasks.pcc.metrics import CompletionScores, completion_metrics
from nearest_reference import brute_nearest_squared, squared_at


def brute_force_fps(points: torch.Tensor, n: int) -> list[int]:
    """One cloud [N, 3], point by point in Python: start at 0, then the point whose
    distance to its nearest chosen point is largest (the lowest index on ties)."""
    chosen = [0]
    while len(chosen) < n:
        best, best_distance = None, -1.0
        for i in range(len(points)):
            d = min(float(((points[i] - points[j]) ** 2).sum()) for j in chosen)
            if d > best_distance:
                best, best_distance = i, d
        chosen.append(best)
    return chosen


def test_fps_matches_brute_force():
    points = torch.rand(3, 40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    index = farthest_point_sample(points, 9)
    for b in range(3):
        assert index[b].tolist() == brute_force_fps(points[b], 9)


def test_fps_picks_the_corners_of_a_square():
    # The 4 corners and many interior points: FPS's first 4 samples are the corners.
    inner = torch.rand(30, 3, generator=torch.Generator().manual_seed(1)) * 0.5 + 0.25
    inner[:, 2] = 0
    corners = torch.tensor([[0.0, 0, 0], [1, 1, 0], [1, 0, 0], [0, 1, 0]])
    cloud = torch.cat([corners[:1], inner, corners[1:]])[None]
    assert sorted(farthest_point_sample(cloud, 4)[0].tolist()) == [0, 31, 32, 33]


def test_knn_matches_brute_force():
    g = torch.Generator().manual_seed(2)
    points, queries = torch.rand(2, 50, 3, generator=g), torch.rand(2, 7, 3, generator=g)
    index = knn(queries, points, 5, max_elements=60)  # chunks of one query row
    for b in range(2):
        for m in range(7):
            distances = [(float(((queries[b, m] - p) ** 2).sum()), i) for i, p in enumerate(points[b])]
            assert index[b, m].tolist() == [i for _, i in sorted(distances)[:5]]
    assert gather_points(points, index).shape == (2, 7, 5, 3)


def test_identical_clouds_give_zero_and_fscore_one():
    cloud = torch.rand(2, 100, 3, generator=torch.Generator().manual_seed(3))
    figures = completion_metrics(cloud, cloud)
    assert figures["cd_l1"].tolist() == [0.0, 0.0]
    assert figures["cd_l2"].tolist() == [0.0, 0.0]
    assert figures["fscore"].tolist() == [1.0, 1.0]


def test_a_shifted_grid_gives_the_shift():
    # Points 1 apart on a line, shifted by s < 1/2 along it: every nearest neighbour is s away.
    s = 0.004
    line = torch.zeros(1, 20, 3, dtype=torch.float64)
    line[0, :, 0] = torch.arange(20)
    figures = completion_metrics(line + torch.tensor([s, 0, 0], dtype=torch.float64), line)
    assert figures["cd_l1"].item() == pytest.approx(s * 1000)            # (s + s) / 2 x 1000
    assert figures["cd_l2"].item() == pytest.approx(2 * s * s * 1000)    # (s^2 + s^2) x 1000
    assert figures["fscore"].item() == 1.0                               # s < 0.01
    far = completion_metrics(line + torch.tensor([0, 0.02, 0], dtype=torch.float64), line)
    assert far["fscore"].item() == 0.0                                   # P = R = 0 -> 0


def test_fscore_by_hand():
    # truth: 4 points; prediction: 2 on truth points, 1 near (0.005), 1 far (0.5)
    truth = torch.tensor([[[0.0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]]])
    prediction = torch.tensor([[[0.0, 0, 0], [1, 0, 0], [2, 0.005, 0], [10, 0, 0]]])
    figures = completion_metrics(prediction, truth)
    precision, recall = 3 / 4, 3 / 4  # truth point 3 is 1 from its nearest prediction (2, .005, 0)
    assert figures["fscore"].item() == pytest.approx(2 * precision * recall / (precision + recall))
    d1 = [0, 0, 0.005**2, 7**2]
    d2 = [0, 0, 0.005**2, 1 + 0.005**2]
    assert figures["cd_l2"].item() == pytest.approx((sum(d1) / 4 + sum(d2) / 4) * 1000)
    l1 = (sum(map(math.sqrt, d1)) / 4 + sum(map(math.sqrt, d2)) / 4) / 2 * 1000
    assert figures["cd_l1"].item() == pytest.approx(l1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_both_nearest_searches_find_the_nearest_point(dtype):
    g = torch.Generator().manual_seed(4)
    a, b = torch.rand(2, 300, 3, generator=g, dtype=dtype), torch.rand(2, 200, 3, generator=g, dtype=dtype)
    a[:, :50] = b[:, :50]  # points of a that are in b: distance 0
    b[1, 100:] = b[1, 0]   # one cloud with 100 copies of a point (ties)
    dense = brute_nearest_squared(a, b)
    rel = dict(rtol=1e-12, atol=0) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-9)
    searches = {
        "tree": nearest_by_tree(a, b),
        "matmul": nearest_by_matmul(a, b),
        "matmul, chunks of 7 rows": nearest_by_matmul(a, b, max_elements=2 * 200 * 7),
        "matmul, one row at a time": nearest_by_matmul(a, b, max_elements=1),
    }
    for name, nearest in searches.items():
        assert nearest.shape == (2, 300) and nearest.dtype == torch.long, name
        found = squared_at(a, b, nearest)
        torch.testing.assert_close(found, dense, **rel, msg=lambda m: f"{name}: {m}")
    assert torch.all(nearest_squared_distances(a, b)[:, :50] == 0)
    torch.testing.assert_close(nearest_squared_distances(a, b).double(), dense, **rel)


def test_without_triton_the_kernel_search_takes_the_matmul_form(monkeypatch):
    monkeypatch.setitem(sys.modules, "lavo_tasks.kernels.nearest", None)  # its import now fails
    g = torch.Generator().manual_seed(8)
    a, b = torch.rand(2, 30, 3, generator=g), torch.rand(2, 20, 3, generator=g)
    with pytest.warns(RuntimeWarning, match="nearest_by_kernel: Triton path unavailable"):
        nearest = nearest_by_kernel(a, b)
    found = squared_at(a, b, nearest)
    torch.testing.assert_close(found, brute_nearest_squared(a, b), rtol=1e-5, atol=1e-9)


def test_compiled_distances_take_the_kernel_search_as_one_operator(monkeypatch):
    """As FPS's (tests/kernels/test_fps_kernel.py): a fullgraph compile of the distances
    with `on_kernels` forced true runs the search's custom operator, on the CPU through
    the interpreter."""
    from lavo_tasks.tasks.pcc import geometry
    g = torch.Generator().manual_seed(9)
    a, b = torch.rand(2, 30, 3, generator=g), torch.rand(2, 20, 3, generator=g)
    torch.library.opcheck(geometry.nearest_by_kernel_op, (a, b),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    monkeypatch.setattr(geometry, "on_kernels", lambda *clouds: True)
    compiled = torch.compile(geometry.nearest_squared_distances, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b).double(), brute_nearest_squared(a, b), rtol=1e-5, atol=1e-9)


def test_the_tree_search_takes_bf16_clouds_and_one_point_clouds():
    a = torch.tensor([[[0.0, 0, 0], [2, 0, 0]]], dtype=torch.bfloat16)
    b = torch.tensor([[[1.5, 0, 0]]], dtype=torch.bfloat16)
    assert nearest_by_tree(a, b).tolist() == [[0, 0]]
    assert nearest_by_tree(b, a).tolist() == [[1]]


def test_the_tree_search_searches_in_the_finer_precision():
    # 1 + 2^-30 and 1 - 2^-29 are 1.0 in float32: only a float64 search tells them apart
    a = torch.tensor([[[1.0, 0, 0]]], dtype=torch.float32)
    b = torch.tensor([[[1 - 2**-29, 0, 0], [1 + 2**-30, 0, 0]]], dtype=torch.float64)
    assert nearest_by_tree(a, b).tolist() == [[1]]


@pytest.mark.parametrize("a_shape, b_shape", [((3, 4, 3), (1, 5, 3)), ((1, 4, 3), (1, 0, 3))])
def test_the_tree_search_refuses_unpaired_or_empty_clouds(a_shape, b_shape):
    with pytest.raises(ValueError, match="nearest_by_tree: clouds"):
        nearest_by_tree(torch.rand(a_shape), torch.rand(b_shape))


def test_chamfer_loss_gradient_moves_points_closer():
    truth = torch.rand(1, 64, 3, generator=torch.Generator().manual_seed(5))
    prediction = (truth + 0.1).requires_grad_()
    loss = chamfer_l1_loss(prediction, truth)
    loss.backward()
    with torch.no_grad():
        moved = prediction - 0.01 * prediction.grad / prediction.grad.norm()
    assert chamfer_l1_loss(moved, truth) < loss
    d1, d2 = chamfer_squared(prediction.detach(), truth)
    assert loss.item() == pytest.approx(float((d1.sqrt().mean() + d2.sqrt().mean()) / 2), rel=1e-5)


def test_scores_average_samples_and_categories():
    truth = torch.zeros(3, 1, 3, dtype=torch.float64)
    prediction = torch.tensor([[[0.001, 0, 0]], [[0.003, 0, 0]], [[0.1, 0, 0]]], dtype=torch.float64)
    scores = CompletionScores(["box", "cone"])
    scores.update(prediction[:2], truth[:2], torch.tensor([0, 1]))
    scores.update(prediction[2:], truth[2:], torch.tensor([1]))  # a smaller batch
    figures = scores.compute()
    assert figures["cd_l1"] == pytest.approx((1 + 3 + 100) / 3)  # the mean over samples, not batches
    assert figures["cd_l1_box"] == pytest.approx(1)
    assert figures["cd_l1_cone"] == pytest.approx((3 + 100) / 2)
    assert figures["fscore_cone"] == pytest.approx(0.5)


def test_scores_skip_categories_without_samples():
    scores = CompletionScores(["box", "cone"])
    scores.update(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.tensor([1]))
    assert set(scores.compute()) == {"cd_l1", "cd_l2", "fscore", "cd_l1_cone", "cd_l2_cone", "fscore_cone"}


def _score_share(rank: int, world: int, port: int, results) -> None:
    """One gloo process: scores its share of the batch _shared_batch() makes."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    prediction, truth, category = _shared_batch()
    scores = CompletionScores(["box", "cone"])
    scores.update(prediction[rank::world], truth[rank::world], category[rank::world])
    results[rank] = {k: float(v) for k, v in scores.compute().items()}
    dist.destroy_process_group()


def _shared_batch():
    g = torch.Generator().manual_seed(11)
    truth = torch.rand(5, 20, 3, generator=g)
    prediction = truth + 0.01 * torch.randn(5, 20, 3, generator=g)
    return prediction, truth, torch.tensor([0, 1, 1, 0, 1])


def test_scores_on_two_processes_equal_one_process():
    """Two gloo processes, each scoring every other sample (3 and 2 samples, so a plain
    mean of the two processes' means would differ), both get the one-process figures."""
    import socket

    import torch.multiprocessing as mp

    prediction, truth, category = _shared_batch()
    single = CompletionScores(["box", "cone"])
    single.update(prediction, truth, category)
    expected = {k: float(v) for k, v in single.compute().items()}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_score_share, args=(2, port, results), nprocs=2, join=True)
    for rank in range(2):
        assert results[rank] == pytest.approx(expected, rel=1e-12)


def test_nearest_neighbours_ignore_autocast():
    """Under bf16 autocast the neighbours are those of fp32: points 1e-3 apart near 0.5
    are distinct in fp32 but one bf16 value."""
    truth = torch.tensor([[[0.5, 0.0, 0.0], [0.501, 0.0, 0.0], [0.502, 0.0, 0.0]]])
    prediction = torch.tensor([[[0.5012, 0.0, 0.0]]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        d1, _ = chamfer_squared(prediction, truth)
        index = knn(prediction, truth, 1)
    assert index.item() == 1
    assert d1.item() == pytest.approx(0.0002 ** 2, rel=1e-3)


def test_default_eval_truth_is_dense_enough_for_the_fscore():
    """Two independent uniform samples of one surface: a perfect completion. Against the
    default config's val/test truth (data.n_gt_eval points) on a unit-area square (the
    default shapes' surfaces average 1.2) nearly every predicted point lies within the
    F-score's 0.01 of a true point, as the Poisson estimate 1 - exp(-n pi r^2 / area)
    says; so the F-score measures the prediction, not the sampling of the truth."""
    from lavo_tasks.config import compose

    n_truth = compose(["task=pcc"]).data.n_gt_eval
    g = torch.Generator().manual_seed(0)
    flat = lambda n: torch.cat([torch.rand(n, 2, generator=g, dtype=torch.float64),
                                torch.zeros(n, 1, dtype=torch.float64)], dim=1)
    truth, prediction = flat(n_truth), flat(4096)
    distances = torch.cdist(prediction, truth)
    precision = float((distances.min(1).values < 0.01).double().mean())
    recall = float((distances.min(0).values < 0.01).double().mean())
    expected = 1 - math.exp(-n_truth * math.pi * 0.01**2)  # less a little at the square's edges
    assert precision >= 0.85
    assert expected - 0.03 < precision <= expected + 0.01
    fscore = float(completion_metrics(prediction[None], truth[None])["fscore"])
    assert fscore == pytest.approx(2 * precision * recall / (precision + recall))
