"""Completion metrics as PoinTr defines them, per sample, then averaged.

With d1, d2 the squared nearest-neighbour distances prediction -> truth and truth ->
prediction (geometry.chamfer_squared):

- CD-l1 = (mean sqrt d1 + mean sqrt d2) / 2 x 1000
- CD-l2 = (mean d1 + mean d2) x 1000
- F-score@1%: precision = the share of predicted points within 0.01 of the truth,
  recall = the share of true points within 0.01 of the prediction (non-squared
  distances, strictly below the threshold, as open3d's compute_point_cloud_distance is
  used by PoinTr), F = 2PR / (P + R), 0 when both are 0.

The threshold is absolute: 1% of the PCN objects' unit scale. The figures are means over
samples (every test model once), overall and per category.
"""

import torch
from torchmetrics import Metric

from .geometry import chamfer_squared

FSCORE_THRESHOLD = 0.01
METRICS = ("cd_l1", "cd_l2", "fscore")


def completion_metrics(prediction: torch.Tensor, truth: torch.Tensor,
                       threshold: float = FSCORE_THRESHOLD) -> dict[str, torch.Tensor]:
    """Per-sample {cd_l1, cd_l2, fscore}, each [B] float64, for prediction [B, N, 3] and
    truth [B, M, 3]."""
    d1, d2 = chamfer_squared(prediction.double(), truth.double())
    precision = (d1.sqrt() < threshold).double().mean(1)
    recall = (d2.sqrt() < threshold).double().mean(1)
    total = precision + recall
    fscore = torch.where(total > 0, 2 * precision * recall / total.clamp_min(1e-300), torch.zeros_like(total))
    return {
        "cd_l1": (d1.sqrt().mean(1) + d2.sqrt().mean(1)) / 2 * 1000,
        "cd_l2": (d1.mean(1) + d2.mean(1)) * 1000,
        "fscore": fscore,
    }


class CompletionScores(Metric):
    """Per-sample metrics summed per category over every update on every process:
    `compute` gives the means over all samples (`cd_l1`, ...) and per category
    (`cd_l1_<category>`, ...; only categories with samples), as float64 scalars.

    The states are float64 sums and counts per category, which torchmetrics adds up over
    the processes in `compute`, so each process may score its own share of the test set
    and every process gets the figures of the whole (the sum is a collective call: every
    process must call `compute`)."""

    full_state_update = False  # update() only adds to the states

    def __init__(self, category_names: list[str]):
        super().__init__()
        self.category_names = list(category_names)
        n = len(self.category_names)
        self.add_state("sums", torch.zeros(n, len(METRICS), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("counts", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, prediction: torch.Tensor, truth: torch.Tensor, category: torch.Tensor) -> None:
        """prediction [B, N, 3], truth [B, M, 3], category [B] (indices into the names)."""
        values = completion_metrics(prediction, truth)
        per_sample = torch.stack([values[name] for name in METRICS], dim=1).to(self.sums)  # [B, len(METRICS)]
        category = category.to(self.sums.device).long()
        self.sums.index_add_(0, category, per_sample)
        self.counts.index_add_(0, category, torch.ones_like(category, dtype=self.counts.dtype))

    def compute(self) -> dict[str, torch.Tensor]:
        if self.counts.sum() == 0:
            raise ValueError("CompletionScores: no samples on any process")
        figures = {}
        overall = self.sums.sum(0) / self.counts.sum()  # [len(METRICS)]
        scored = (self.counts > 0).nonzero().flatten().tolist()
        for m, name in enumerate(METRICS):
            figures[name] = overall[m]
            for c in scored:
                figures[f"{name}_{self.category_names[c]}"] = self.sums[c, m] / self.counts[c]
        return figures
