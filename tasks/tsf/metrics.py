"""Forecast metrics.

- MSE / MAE on the scaled values, the Informer / CAB protocol: the mean over every
  (window, horizon step, channel) of the test set, as torchmetrics' MeanSquaredError /
  MeanAbsoluteError accumulate them (tasks.tsf.module).
- MASE, sMAPE, ND on the unscaled values, as gluonts' evaluation (`gluonts.ev`, axis=None)
  defines them: each (window, channel) pair is one forecast of `pred_len` steps, the
  point forecast plays the median ("0.5"); MASE is the mean over every forecast step of
  the absolute error over the seasonal error of the series' whole history before the
  forecast start (the seasonality from the frequency, `gluonts.time_feature.get_seasonality`),
  sMAPE the mean of 2 |y - f| / (|y| + |f|), ND the summed absolute error over the summed
  absolute truth. `ForecastErrors` keeps them as float64 sums that torchmetrics adds
  up over the processes (lavo_tasks.metrics), so each process may score its own share of
  the test windows.
"""

import numpy as np
import torch
from torch import nn

from ...metrics import Mean, SumRatio


def seasonal_errors(series: np.ndarray, starts: np.ndarray, seasonality: int) -> np.ndarray:
    """gluonts' seasonal error of each channel's history before each forecast start s:
    the mean over t in [m, s) of |y_t - y_{t-m}|, with m = `seasonality`, or m = 1 when
    the history is not longer than that (as gluonts falls back).
    series [rows, C], starts [W] (each >= 2) -> [W, C]."""
    out = np.empty((len(starts), series.shape[1]))
    short = starts <= seasonality
    for m, chosen in ((seasonality, ~short), (1, short)):
        if chosen.any():
            diffs = np.abs(series[m:] - series[:-m])  # diffs[t - m] = |y_t - y_{t-m}|, [rows - m, C]
            sums = np.concatenate([np.zeros((1, series.shape[1])), np.cumsum(diffs, axis=0)])  # [rows - m + 1, C]
            s = starts[chosen]
            out[chosen] = sums[s - m] / (s - m)[:, None]
    return out


class ForecastErrors(nn.Module):
    """MASE, sMAPE and ND (gluonts' definitions, see the module docstring) of every
    forecast step of every update on every process, as lavo_tasks.metrics' float64 sums:
    MASE and sMAPE a `Mean` of per-step values, ND a `SumRatio`. As in gluonts, a step
    where both truth and forecast are 0 makes sMAPE NaN, and a zero seasonal error makes
    MASE inf or NaN."""

    def __init__(self):
        super().__init__()
        self.mase, self.smape, self.nd = Mean(), Mean(), SumRatio()

    def update(self, prediction: torch.Tensor, truth: torch.Tensor, seasonal_error: torch.Tensor) -> None:
        """prediction, truth [B, H, C] unscaled; seasonal_error [B, C]."""
        prediction, truth = prediction.detach().double(), truth.detach().double()
        error = (truth - prediction).abs()  # [B, H, C]
        self.mase.update(error / seasonal_error.detach().double()[:, None])
        self.smape.update(2 * error / (truth.abs() + prediction.abs()))
        self.nd.update(error, truth.abs())

    def reset(self) -> None:
        for metric in (self.mase, self.smape, self.nd):
            metric.reset()

    def compute(self) -> dict[str, float]:
        """{"mase", "smape", "nd"} of the whole set, the same on every process (a collective
        call under DDP: every process must make it)."""
        return {name: float(metric.compute()) for name, metric in
                (("mase", self.mase), ("smape", self.smape), ("nd", self.nd))}
