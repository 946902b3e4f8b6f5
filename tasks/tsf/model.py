"""Informer-style encoder-decoder forecaster built from the shared stacks.

    encoder: embed(x, x_mark) over seq_len steps -> Encoder, N layers (NS)
    decoder: embed([y_known, zeros], y_mark) over label_len + pred_len steps
             -> Decoder, M layers (causal self, CS; noncausal cross, NC)
    head:    the last pred_len decoder positions -> Linear -> n_outputs channels

With `instance_norm` (RevIN, Kim et al., ICLR 2022) each window is first normalised by
its own statistics: every input channel's mean and standard deviation over the encoder's
seq_len steps, then a learnable per-channel affine. The decoder's known label_len steps
are normalised with the same statistics (they are the window's last steps), and the
forecast channels are de-normalised with them, so the network sees windows of one level
and scale wherever in the series they lie.

The embedding is Informer's: a circular convolution of width 3 over the values, plus
fixed sinusoidal positions, plus a learned embedding of each calendar feature that
`calendar` names (of month, day, weekday, hour, minute), summed. Each of the three
attention sites takes its own attention config (encoder self, decoder self,
decoder->encoder cross).
"""

import math
from collections.abc import Sequence

import torch
from omegaconf import DictConfig
from torch import nn

from ...stacks import Decoder, Encoder
from .data import TIME_FEATURES

RIDGE = 1e-6  # the shortcut's least-squares fit: ridge term per window, on the weights (not the intercept)


def sinusoidal_positions(length: int, d_model: int, device=None) -> torch.Tensor:
    """[length, d_model]: sin on even, cos on odd features (Vaswani et al.)."""
    position = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, d_model, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model, device=device)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)[:, : d_model // 2]
    return table


class SeriesEmbedding(nn.Module):
    """values [B, T, C] and calendar features [B, T, 5] (the columns of
    data.time_features) -> [B, T, d_model], embedding the features `calendar` names."""

    def __init__(self, n_channels: int, d_model: int, dropout: float, calendar: Sequence[str]):
        super().__init__()
        self.values = nn.Conv1d(n_channels, d_model, kernel_size=3, padding=1, padding_mode="circular", bias=False)
        self.calendar = nn.ModuleDict({name: nn.Embedding(TIME_FEATURES[name], d_model) for name in calendar})
        self.columns = [list(TIME_FEATURES).index(name) for name in calendar]
        self.drop = nn.Dropout(dropout)

    def forward(self, values: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        h = self.values(values.transpose(1, 2)).transpose(1, 2)  # [B, C, T] -> [B, D, T] -> [B, T, D]
        h = h + sinusoidal_positions(values.shape[1], h.shape[-1], values.device)
        for column, embedding in zip(self.columns, self.calendar.values()):
            h = h + embedding(marks[..., column])
        return self.drop(h)


class InstanceNorm(nn.Module):
    """RevIN: `normalise` a window by its own per-channel mean and standard deviation over
    time (population, plus `eps` under the root), then a learnable per-channel affine;
    `denormalise` inverts both for the last `n` channels, with the statistics of the
    window last normalised (set by `statistics`). Parameters: `weight`, `bias` [C]."""

    def __init__(self, n_channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_channels))
        self.bias = nn.Parameter(torch.zeros(n_channels))

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, C] -> mean, std [B, 1, C]."""
        mean = x.mean(dim=1, keepdim=True)
        std = torch.sqrt(x.var(dim=1, keepdim=True, unbiased=False) + self.eps)
        return mean, std

    def normalise(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] with the statistics [B, 1, C] of its window."""
        return (x - mean) / std * self.weight + self.bias

    def descale(self, y: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """y [B, T, n] normalised values of the last n channels -> their deviations from the
        window's mean, in the original scale."""
        n = y.shape[-1]
        weight, bias = self.weight[-n:], self.bias[-n:]
        return (y - bias) / (weight + self.eps**2) * std[..., -n:]

    def denormalise(self, y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """y [B, T, n] normalised values of the last n channels -> their original scale."""
        return self.descale(y, std) + mean[..., -y.shape[-1]:]


class Forecaster(nn.Module):
    def __init__(self, n_inputs: int, n_outputs: int, *, seq_len: int, pred_len: int, d_model: int, n_heads: int,
                 encoder_layers: int, decoder_layers: int, d_ff: int, dropout: float, instance_norm: bool,
                 linear_shortcut: bool, calendar: Sequence[str], encoder_attention: DictConfig,
                 decoder_attention: DictConfig, cross_attention: DictConfig):
        super().__init__()
        self.n_outputs = n_outputs
        self.shortcut = nn.Linear(seq_len, pred_len) if linear_shortcut else None
        self.instance_norm = InstanceNorm(n_inputs) if instance_norm else None
        self.encoder_embedding = SeriesEmbedding(n_inputs, d_model, dropout, calendar)
        self.decoder_embedding = SeriesEmbedding(n_inputs, d_model, dropout, calendar)
        self.encoder = Encoder(d_model=d_model, n_heads=n_heads, n_layers=encoder_layers, attention=encoder_attention,
                               d_ff=d_ff, dropout=dropout)
        self.decoder = Decoder(d_model=d_model, n_heads=n_heads, n_layers=decoder_layers,
                               self_attention=decoder_attention, cross_attention=cross_attention, d_ff=d_ff,
                               dropout=dropout, cross_causal=False)
        self.head = nn.Linear(d_model, n_outputs)
        if self.shortcut is not None:
            # Fitted in closed form (fit_shortcut), not trained: Adam's steps of ~lr per weight
            # would soon undo a fit whose weights are ~0.01. The head starts at zero, so the
            # model starts as the shortcut alone.
            self.shortcut.requires_grad_(False)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    @torch.no_grad()
    def fit_shortcut(self, x: torch.Tensor, y: torch.Tensor, ridge: float = RIDGE, chunk: int = 4096) -> None:
        """Set the shortcut to the least-squares fit of windows x [N, seq_len, C] -> y
        [N, pred_len, C]: every forecast channel's future minus its last input value, from
        its inputs minus that value, one map for all channels (see `linear_forecast`).
        The normal equations are summed over `chunk` windows at a time, so x and y may be
        strided views of the series and no [N * C, seq_len] copy is made."""
        n, seq_len = self.n_outputs, x.shape[1]
        gram = x.new_zeros(seq_len + 1, seq_len + 1, dtype=torch.float64)
        moment = x.new_zeros(seq_len + 1, y.shape[1], dtype=torch.float64)
        for start in range(0, len(x), chunk):
            xs, ys = x[start:start + chunk, :, -n:].double(), y[start:start + chunk, :, -n:].double()
            last = xs[:, -1:]  # [chunk, 1, n]
            inputs = (xs - last).transpose(1, 2).reshape(-1, seq_len)  # [chunk * n, seq_len]
            inputs = torch.cat([inputs, inputs.new_ones(len(inputs), 1)], dim=1)  # the intercept's column
            targets = (ys - last).transpose(1, 2).reshape(-1, y.shape[1])  # [chunk * n, pred_len]
            gram += inputs.T @ inputs
            moment += inputs.T @ targets
        diagonal = torch.arange(seq_len)
        gram[diagonal, diagonal] += ridge * len(x) * n  # not on the intercept
        solution = torch.linalg.solve(gram, moment)  # [seq_len + 1, pred_len]
        self.shortcut.weight.copy_(solution[:-1].T)
        self.shortcut.bias.copy_(solution[-1])

    def linear_forecast(self, x: torch.Tensor) -> torch.Tensor:
        """The shortcut's forecast, NLinear's (Zeng et al., AAAI 2023): x [B, seq_len, C] ->
        [B, pred_len, n_outputs], each forecast channel's last value plus a linear map of its
        inputs' deviations from that value. The map moves with the window's level, not its scale."""
        last = x[:, -1:, -self.n_outputs:]  # [B, 1, n_outputs]
        deviations = (x[..., -self.n_outputs:] - last).transpose(1, 2)  # [B, n_outputs, seq_len]
        return last + self.shortcut(deviations).transpose(1, 2)  # [B, n_outputs, pred_len] -> [B, pred_len, n_outputs]

    def forward(self, x: torch.Tensor, x_mark: torch.Tensor, y_known: torch.Tensor, y_mark: torch.Tensor) -> torch.Tensor:
        """x [B, seq_len, C], x_mark [B, seq_len, 5]; y_known [B, label_len, C] (the last
        label_len input steps); y_mark [B, label_len + pred_len, 5].
        Returns the forecast [B, pred_len, n_outputs]."""
        pred_len = y_mark.shape[1] - y_known.shape[1]
        linear = self.linear_forecast(x) if self.shortcut is not None else None
        if self.instance_norm is not None:
            mean, std = self.instance_norm.statistics(x)
            x, y_known = self.instance_norm.normalise(x, mean, std), self.instance_norm.normalise(y_known, mean, std)
        memory = self.encoder(self.encoder_embedding(x, x_mark))
        placeholder = y_known.new_zeros(y_known.shape[0], pred_len, y_known.shape[2])
        h = self.decoder_embedding(torch.cat([y_known, placeholder], dim=1), y_mark)  # [B, label_len + pred_len, D]
        forecast = self.head(self.decoder(h, memory)[:, -pred_len:])  # [B, pred_len, n_outputs]
        if linear is not None:  # the transformer forecasts the shortcut's residual, in the window's scale
            if self.instance_norm is not None:
                forecast = self.instance_norm.descale(forecast, std)
            return linear + forecast
        if self.instance_norm is not None:
            forecast = self.instance_norm.denormalise(forecast, mean, std)
        return forecast
