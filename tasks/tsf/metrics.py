"""Forecast metrics.

- MSE / MAE on the scaled values, the Informer / CAB protocol: the mean over every
  (window, horizon step, channel) of the test set, as torchmetrics' MeanSquaredError /
  MeanAbsoluteError accumulate them (tasks.tsf.module).
- MASE, sMAPE, ND on the unscaled values through gluonts' evaluation (`gluonts.ev`):
  each (window, channel) pair is one forecast of `pred_len` steps; the point forecast
  plays the median ("0.5"). As gluonts' Evaluator does, MASE is scaled by the seasonal
  error of the series' whole history before the forecast start (the seasonality from the
  frequency, `gluonts.time_feature.get_seasonality`), and the figures are aggregated as
  gluonts does: MASE and sMAPE the mean over all forecast steps, ND the summed absolute
  error over the summed absolute truth.
"""

import numpy as np
from gluonts.ev.metrics import MASE, ND, SMAPE


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


class GluonTSErrors:
    """MASE, sMAPE and ND through gluonts.ev, fed one batch of forecasts at a time."""

    def __init__(self):
        self.metrics = (MASE() + SMAPE() + ND())(axis=None)

    def update(self, prediction: np.ndarray, truth: np.ndarray, seasonal_error: np.ndarray) -> None:
        """prediction, truth [B, H, C] unscaled; seasonal_error [B, C]."""
        self.metrics.update(
            {
                "label": truth.transpose(0, 2, 1).reshape(-1, truth.shape[1]),  # [B*C, H]
                "0.5": prediction.transpose(0, 2, 1).reshape(-1, prediction.shape[1]),
                "seasonal_error": seasonal_error.reshape(-1, 1),  # [B*C, 1]
            }
        )

    def compute(self) -> dict[str, float]:
        values = self.metrics.get()
        return {"mase": float(values["MASE[0.5]"]), "smape": float(values["sMAPE[0.5]"]), "nd": float(values["ND[0.5]"])}
