"""Model-free forecasts the test reports beside the model's.

- Persistence: every forecast step repeats the window's last value.
- Linear: per channel, the least-squares affine map from a window's seq_len values to
  its pred_len future values (DLinear's "Linear", Zeng et al., AAAI 2023), fitted in
  closed form on every training window. The normal equations carry a ridge term of
  RIDGE times the mean diagonal of X^T X (not on the intercept): consecutive values are
  nearly collinear, and the term keeps the solve well-posed without changing a
  well-determined fit beyond float64 rounding.
"""

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

RIDGE = 1e-9


def last_value_forecast(x: torch.Tensor, pred_len: int) -> torch.Tensor:
    """x [B, seq_len, C] -> [B, pred_len, C], the last input step repeated."""
    return x[:, -1:].repeat(1, pred_len, 1)


class LinearForecast:
    """`fit(series)` on the training rows [rows, C]; `__call__(x)` forecasts windows.
    `weights` [C, seq_len + 1, pred_len] float64, the last row of each the intercept."""

    def __init__(self, seq_len: int, pred_len: int):
        self.seq_len, self.pred_len = seq_len, pred_len
        self.weights: np.ndarray | None = None

    def fit(self, series: np.ndarray) -> "LinearForecast":
        series = np.asarray(series, dtype=np.float64)
        if len(series) < self.seq_len + self.pred_len:
            raise ValueError(f"{len(series)} rows hold no window of seq_len + pred_len = "
                             f"{self.seq_len + self.pred_len}")
        windows = sliding_window_view(series, self.seq_len + self.pred_len, axis=0)  # [N, C, seq_len + pred_len]
        ones = np.ones((len(windows), 1))
        weights = []
        for c in range(series.shape[1]):
            inputs = np.concatenate([windows[:, c, : self.seq_len], ones], axis=1)  # [N, seq_len + 1]
            targets = windows[:, c, self.seq_len :]  # [N, pred_len]
            gram = inputs.T @ inputs
            ridge = RIDGE * np.trace(gram[:-1, :-1]) / self.seq_len
            gram[np.arange(self.seq_len), np.arange(self.seq_len)] += ridge
            weights.append(np.linalg.solve(gram, inputs.T @ targets))
        self.weights = np.stack(weights)
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, seq_len, C] -> [B, pred_len, C], in x's dtype and device."""
        weights = torch.as_tensor(self.weights, device=x.device)
        inputs = x.double().transpose(1, 2)  # [B, C, seq_len]
        forecast = torch.einsum("bcl,clp->bcp", inputs, weights[:, :-1]) + weights[:, -1]  # [B, C, pred_len]
        return forecast.transpose(1, 2).to(x.dtype)
