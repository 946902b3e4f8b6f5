"""Point-cloud geometry, batched, on any device: farthest point sampling, k nearest
neighbours, gathering, and the nearest-neighbour distances Chamfer is built on.

Nothing here loops over points in Python. Two Triton kernels serve fp32 (or narrower)
CUDA clouds (`on_kernels`; under torch.compile each is one custom-operator node): farthest
point sampling (kernels/fps.py), which elsewhere loops over the samples it draws, each
step vectorised over the batch and all points; and the training loss's nearest-neighbour
search (kernels/nearest.py: no pairwise matrix is written). Elsewhere the nearest
neighbours come from open3d's k-d tree on the CPU (one search per cloud: it visits a few
dozen candidates per point where the matmul form visits all of them) and the matmul form
on a GPU (the metrics' float64 clouds). The distance functions loop over chunks of query
points so that at most `max_elements` pairwise distances exist at once (a 16K x 16K
matrix would be 1 GiB per cloud in fp32): by default MAX_ELEMENTS on the CPU and
MAX_ELEMENTS_CUDA on a GPU, where fewer, larger chunks save kernel launches.
"""

import numpy as np
import torch

from ...kernels.backend import resolve_backend, run_triton
from ...open3d import load as load_open3d

# Pairwise distances held at once by the chunked functions: 64 MiB of fp32 on the CPU,
# 1 GiB on a GPU.
MAX_ELEMENTS = 1 << 24
MAX_ELEMENTS_CUDA = 1 << 28


def on_kernels(*clouds: torch.Tensor) -> bool:
    """Whether the geometry kernels serve a call on these clouds: CUDA, at most fp32, and
    LAVO_TASKS_BACKEND (as for the attention ops) not set to torch; torch.compile reads
    the variable when it traces, so set it before compiling."""
    return (all(c.is_cuda and c.dtype != torch.float64 for c in clouds)
            and resolve_backend("auto", *clouds) == "triton")


def default_max_elements(device: torch.device) -> int:
    return MAX_ELEMENTS_CUDA if device.type == "cuda" else MAX_ELEMENTS


def gather_points(points: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """points [B, N, C], index [B, ...] long -> [B, ..., C]: points[b, index[b, ...]]."""
    batch, flat = index.shape[0], index.reshape(index.shape[0], -1)  # [B, M]
    picked = torch.gather(points, 1, flat[..., None].expand(-1, -1, points.shape[-1]))  # [B, M, C]
    return picked.reshape(batch, *index.shape[1:], points.shape[-1])


@torch.no_grad()
def farthest_point_sample(points: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Indices [B, n_samples] of a greedy farthest point sampling of points [B, N, 3]:
    the first sample is point 0, each next one the point farthest from those chosen (the
    lowest index among equally far points). Needs n_samples <= N. Clouds that `on_kernels`
    accepts are sampled by `farthest_point_sample_by_kernel`, the rest by
    `farthest_point_sample_by_loop`."""
    n_points = points.shape[1]
    if not 1 <= n_samples <= n_points:
        raise ValueError(f"farthest_point_sample: n_samples={n_samples} must be in [1, {n_points}]")
    if on_kernels(points):  # the operator while torch.compile traces: one graph node
        sample = farthest_point_sample_op if torch.compiler.is_compiling() else farthest_point_sample_by_kernel
        return sample(points, n_samples)
    return farthest_point_sample_by_loop(points, n_samples)


@torch.no_grad()
def farthest_point_sample_by_loop(points: torch.Tensor, n_samples: int) -> torch.Tensor:
    """`farthest_point_sample` in PyTorch, in the clouds' precision: one vectorised step
    per sample drawn (about seven kernel launches each on a GPU)."""
    batch, n_points, _ = points.shape
    chosen = torch.zeros(batch, n_samples, dtype=torch.long, device=points.device)
    nearest = torch.full((batch, n_points), float("inf"), dtype=points.dtype, device=points.device)
    rows = torch.arange(batch, device=points.device)
    last = torch.zeros(batch, dtype=torch.long, device=points.device)
    for i in range(1, n_samples):
        step = (points - points[rows, last][:, None]).square().sum(-1)  # [B, N] to the latest sample
        nearest = torch.minimum(nearest, step)
        last = nearest.argmax(dim=1)
        chosen[:, i] = last
    return chosen


def farthest_point_sample_by_kernel(points: torch.Tensor, n_samples: int) -> torch.Tensor:
    """`farthest_point_sample` in one Triton launch (kernels/fps.py: one program per
    cloud), comparing in fp32; where Triton cannot be imported or a cloud holds more points
    than the kernel does, the loop with a RuntimeWarning."""
    def kernel():
        from ...kernels.fps import farthest_point_indices  # imports Triton: only where it runs
        return farthest_point_indices(points, n_samples)
    return run_triton("auto", "farthest_point_sample_by_kernel", kernel,
                      lambda: farthest_point_sample_by_loop(points, n_samples))


@torch.library.custom_op("lavo_tasks::farthest_point_sample", mutates_args=())
def farthest_point_sample_op(points: torch.Tensor, n_samples: int) -> torch.Tensor:
    """`farthest_point_sample_by_kernel` as a custom operator, which torch.compile keeps as
    one node of the graph; eager calls skip the operator's dispatch, as the attention
    ops' do."""
    return farthest_point_sample_by_kernel(points, n_samples)


@farthest_point_sample_op.register_fake
def _(points, n_samples):
    return points.new_empty(points.shape[0], n_samples, dtype=torch.long)


def squared_distances_at(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B, N]: the squared distance from each point of a [B, N, 3] to b's point at index
    [B, N], differentiable in both clouds."""
    return (a - gather_points(b, index)).square().sum(-1)


def _chunk_rows(batch: int, n_candidates: int, max_elements: int | None, device: torch.device) -> int:
    budget = default_max_elements(device) if max_elements is None else max_elements
    return max(1, budget // max(batch * n_candidates, 1))


def _ranking_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, n, 3], [B, m, 3] -> [B, n, m]: |b|^2 - 2 a.b (one fused batched matmul), which
    is the squared distance less |a|^2, a constant along each row: it ranks each point of
    a's candidates in b as the squared distance does (up to rounding), and is used only
    for that. Computed in at least fp32 with autocast off: in bf16 the ranking of points
    a few thousandths apart (the F-score's scale) would be rounding noise."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    a, b = a.to(dtype), b.to(dtype)
    with torch.autocast(a.device.type, enabled=False):
        return torch.baddbmm(b.square().sum(-1)[:, None], a, b.transpose(1, 2), alpha=-2)


@torch.no_grad()
def knn(queries: torch.Tensor, points: torch.Tensor, k: int, max_elements: int | None = None) -> torch.Tensor:
    """Indices [B, M, k] of the k points of points [B, N, 3] nearest to each of queries
    [B, M, 3], nearest first. Needs k <= N."""
    if not 1 <= k <= points.shape[1]:
        raise ValueError(f"knn: k={k} must be in [1, {points.shape[1]}]")
    rows = _chunk_rows(points.shape[0], points.shape[1], max_elements, points.device)
    parts = [_ranking_distances(q, points).topk(k, dim=-1, largest=False).indices for q in queries.split(rows, dim=1)]
    return torch.cat(parts, dim=1)


@torch.no_grad()
def nearest_by_matmul(a: torch.Tensor, b: torch.Tensor, max_elements: int | None = None) -> torch.Tensor:
    """Indices [B, N] of the point of b [B, M, 3] nearest to each point of a [B, N, 3],
    from the matmul form in chunks of a's points (ties: any of the equally near)."""
    rows = _chunk_rows(a.shape[0], b.shape[1], max_elements, a.device)
    return torch.cat([_ranking_distances(chunk, b).argmin(dim=-1) for chunk in a.split(rows, dim=1)], dim=1)


@torch.no_grad()
def nearest_by_tree(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`nearest_by_matmul` for CPU tensors through open3d's exact k-d tree search
    (nanoflann), one tree per cloud of b, in the clouds' promoted precision (float64 if
    either is, else float32)."""
    if a.shape[0] != b.shape[0] or b.shape[1] == 0:
        raise ValueError(f"nearest_by_tree: clouds {tuple(a.shape)} and {tuple(b.shape)}: the batch sizes must "
                         "match and b must hold a point")
    o3c = load_open3d().core
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    nearest = np.empty(a.shape[:2], dtype=np.int64)
    for i, (points, queries) in enumerate(zip(b.detach().to(dtype), a.detach().to(dtype), strict=True)):
        search = o3c.nns.NearestNeighborSearch(o3c.Tensor.from_numpy(np.ascontiguousarray(points.numpy())))
        search.knn_index()
        index, _ = search.knn_search(o3c.Tensor.from_numpy(np.ascontiguousarray(queries.numpy())), 1)
        nearest[i] = index.numpy()[:, 0]  # a copy: no open3d buffer outlives the search
    return torch.from_numpy(nearest)


def nearest_by_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`nearest_by_matmul` for fp32 / bf16 / fp16 CUDA clouds through one Triton kernel
    (kernels/nearest.py), searched in fp32; where Triton cannot be imported, the matmul
    form with a RuntimeWarning."""
    def kernel():
        from ...kernels.nearest import nearest_index  # imports Triton: only where it runs
        return nearest_index(a, b)
    return run_triton("auto", "nearest_by_kernel", kernel, lambda: nearest_by_matmul(a, b))


@torch.library.custom_op("lavo_tasks::nearest_index", mutates_args=())
def nearest_by_kernel_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`nearest_by_kernel` as a custom operator, for torch.compile (as
    `farthest_point_sample_op`)."""
    return nearest_by_kernel(a, b)


@nearest_by_kernel_op.register_fake
def _(a, b):
    return a.new_empty(a.shape[:2], dtype=torch.long)


def nearest_squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, N]: the squared distance from each point of a [B, N, 3] to its nearest point of
    b [B, M, 3]. The nearest point is found without gradient (`nearest_by_kernel` for
    clouds that `on_kernels` accepts, `nearest_by_tree` on the CPU, `nearest_by_matmul`
    for the rest: float64 CUDA clouds, as the metrics pass, and other devices); the
    distance is then recomputed from the two points' difference, so it is exact (0 for a
    point of a that is in b) and its gradient flows to both clouds."""
    if on_kernels(a, b):  # the operator while torch.compile traces: one graph node
        search = nearest_by_kernel_op if torch.compiler.is_compiling() else nearest_by_kernel
        nearest = search(a.detach(), b.detach())  # [B, N]
    elif a.device.type == "cpu":
        nearest = nearest_by_tree(a, b)
    else:
        nearest = nearest_by_matmul(a, b)
    return squared_distances_at(a, b, nearest)


def chamfer_squared(prediction: torch.Tensor, truth: torch.Tensor):
    """(d1 [B, N], d2 [B, M]): squared nearest-neighbour distances prediction -> truth and
    truth -> prediction, for prediction [B, N, 3] and truth [B, M, 3]."""
    return nearest_squared_distances(prediction, truth), nearest_squared_distances(truth, prediction)


def chamfer_l1_loss(prediction: torch.Tensor, truth: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """The batch mean of PoinTr's CD-l1, (mean sqrt d1 + mean sqrt d2) / 2, a training loss:
    `eps` inside the square root keeps its gradient finite where a distance is 0."""
    d1, d2 = chamfer_squared(prediction, truth)
    return ((d1 + eps).sqrt().mean(1) + (d2 + eps).sqrt().mean(1)).mean() / 2
