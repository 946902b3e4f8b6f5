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

from collections import defaultdict

import torch

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


class CompletionScores:
    """Per-sample metrics accumulated over batches; `compute` gives the means over all
    samples (`cd_l1`, ...) and per category (`cd_l1_<category>`, ...)."""

    def __init__(self, category_names: list[str]):
        self.category_names = category_names
        self.values: dict[str, list[float]] = defaultdict(list)
        self.categories: list[int] = []

    def update(self, prediction: torch.Tensor, truth: torch.Tensor, category: torch.Tensor) -> None:
        for name, values in completion_metrics(prediction, truth).items():
            self.values[name].extend(values.tolist())
        self.categories.extend(category.tolist())

    def compute(self) -> dict[str, float]:
        if not self.categories:
            raise ValueError("CompletionScores: no samples")
        category = torch.tensor(self.categories)
        figures = {}
        for name in METRICS:
            values = torch.tensor(self.values[name], dtype=torch.float64)
            figures[name] = float(values.mean())
            for c in category.unique().tolist():
                figures[f"{name}_{self.category_names[c]}"] = float(values[category == c].mean())
        return figures
