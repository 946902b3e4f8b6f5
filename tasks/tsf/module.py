"""Training and evaluation of the forecaster.

Loss: MSE on the scaled forecast steps (Informer). Validation logs `val_loss` (MSE) and
`val_mae`. Test logs `test_mse`, `test_mae` (scaled, Informer protocol), `test_mase`,
`test_smape`, `test_nd` (unscaled, through gluonts), and the same MSE / MAE of the
model-free repeat-last-value forecast on the same windows (`test_last_value_mse`,
`test_last_value_mae`), and writes `artifacts/forecasts.png`.

Test metrics are accumulated in this process: with several devices each computes them
on its share of the windows, so run the test on one device.
"""

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.dates import ConciseDateFormatter
from matplotlib.figure import Figure  # not pyplot: no global backend state is touched
from omegaconf import DictConfig

from ...config import site_attention
from ...module import TaskModule
from ...plots import attention_label, format_metrics, save_figure
from .metrics import GluonTSErrors, ScaledErrors
from .model import Forecaster

PLOTTED_WINDOWS = 3
PLOTTED_CHANNELS = 7  # M mode: the target and up to 6 other channels (ETTh1 has 7 in all)


class TSFModule(TaskModule):
    # Which test metrics are on the scaled (z-scored) values, which in the file's units.
    METRIC_VALUES = {**{f"test_{k}": "scaled" for k in ("mse", "mae", "last_value_mse", "last_value_mae")},
                     **{f"test_{k}": "unscaled" for k in ("mase", "smape", "nd")}}

    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: TSFDataModule.spec(), {"columns", "n_outputs", "mean", "std"}."""
        super().__init__(cfg)
        m = cfg.model
        n_inputs, self.n_outputs = len(spec["columns"]), spec["n_outputs"]
        self.model = Forecaster(
            n_inputs, self.n_outputs, d_model=m.d_model, n_heads=m.n_heads,
            encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers, d_ff=m.d_ff, dropout=m.dropout,
            encoder_attention=site_attention(cfg, "encoder_attention"),
            decoder_attention=site_attention(cfg, "decoder_attention"),
            cross_attention=site_attention(cfg, "cross_attention"),
        )
        # Unscaling needs the output channels' scaler (the forecast channels are the last
        # n_outputs inputs); the unscaled truth and MASE's scale come with the test batches.
        self.mean = np.asarray(spec["mean"][-self.n_outputs:], dtype=np.float64)
        self.std = np.asarray(spec["std"][-self.n_outputs:], dtype=np.float64)
        self.output_names = spec["columns"][-self.n_outputs:]

    def forecast(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(forecast, truth), both [B, pred_len, n_outputs] scaled."""
        label_len, pred_len = self.cfg.data.label_len, self.cfg.data.pred_len
        y_known = batch["y"][:, :label_len]
        prediction = self.model(batch["x"], batch["x_mark"], y_known, batch["y_mark"])
        return prediction, batch["y"][:, -pred_len:, -self.n_outputs:]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        prediction, truth = self.forecast(batch)
        loss = F.mse_loss(prediction.float(), truth)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(truth))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        prediction, truth = self.forecast(batch)
        prediction = prediction.float()
        self.log("val_loss", F.mse_loss(prediction, truth), prog_bar=True, batch_size=len(truth))
        self.log("val_mae", F.l1_loss(prediction, truth), batch_size=len(truth))

    def on_test_epoch_start(self) -> None:
        self.model_errors, self.last_value_errors = ScaledErrors(), ScaledErrors()
        self.gluonts_errors = GluonTSErrors()
        # A few evenly spaced windows of those the test reads, plotted at its end.
        loader = self.trainer.test_dataloaders
        seen = min(len(loader.dataset), self.trainer.num_test_batches[0] * loader.batch_size)
        self.plotted = dict.fromkeys(np.linspace(0, seen - 1, PLOTTED_WINDOWS).round().astype(int).tolist())

    def test_step(self, batch: dict, batch_idx: int) -> None:
        prediction, truth = self.forecast(batch)
        prediction = prediction.float()
        self.model_errors.update(prediction, truth)
        last_value = batch["x"][:, -1:, -self.n_outputs:].expand_as(truth)  # [B, 1, C] -> [B, pred_len, C]
        self.last_value_errors.update(last_value, truth)

        self.gluonts_errors.update(
            self.unscale(prediction), batch["y_raw"].cpu().numpy(), batch["seasonal_error"].cpu().numpy()
        )
        for row, index in enumerate(batch["index"].tolist()):
            if index in self.plotted:  # input, truth, forecast in the file's units; the first forecast row
                self.plotted[index] = [self.unscale(part[row])
                                       for part in (batch["x"][:, :, -self.n_outputs:], truth, prediction)]
                self.plotted[index].append(int(batch["start"][row]))

    def on_test_epoch_end(self) -> None:
        figures = {f"test_{k}": v for k, v in self.model_errors.compute().items()}
        figures |= {f"test_{k}": v for k, v in self.gluonts_errors.compute().items()}
        figures |= {f"test_last_value_{k}": v for k, v in self.last_value_errors.compute().items()}
        for name, value in figures.items():
            self.log(name, value)
        self.plot_forecasts(figures)

    def unscale(self, values: torch.Tensor) -> np.ndarray:
        """[..., n_outputs] scaled -> float64 numpy in the file's units."""
        return values.detach().double().cpu().numpy() * self.std + self.mean

    def plot_forecasts(self, figures: dict[str, float]) -> None:
        """A few evenly spaced test windows (columns) by forecast channel (rows: the
        target, and in M mode up to PLOTTED_CHANNELS - 1 others, evenly chosen): the
        encoder's input, the truth and the forecast in the file's units against the rows'
        dates; the title gives the attention and the test metrics."""
        windows = {i: parts for i, parts in self.plotted.items() if parts is not None}
        indices = list(windows)
        # [windows, seq_len | pred_len, n_outputs] each, in the file's units
        history, truth, prediction = (np.stack([windows[i][k] for i in indices]) for k in range(3))
        starts = [windows[i][3] for i in indices]
        dates = self.trainer.datamodule.dates  # the rows' dates: only the plot's axis reads them
        seq_len, pred_len = history.shape[1], truth.shape[1]
        # The target (the last output channel) first, then others evenly spread.
        others = np.linspace(0, self.n_outputs - 2, min(PLOTTED_CHANNELS, self.n_outputs) - 1).round().astype(int)
        channels = [self.n_outputs - 1, *dict.fromkeys(others.tolist())] if self.n_outputs > 1 else [0]

        fig = Figure(figsize=(4.2 * len(indices), 1.9 * len(channels) + 1.2))
        axes = fig.subplots(len(channels), len(indices), squeeze=False, sharex="col")
        for col, (i, start) in enumerate(zip(indices, starts)):
            past, future = dates[start - seq_len:start], dates[start:start + pred_len]
            for row, c in enumerate(channels):
                ax = axes[row, col]
                ax.plot(past, history[col, :, c], color="0.5", linewidth=1, label="input")
                ax.plot(future, truth[col, :, c], color="k", linewidth=1, label="truth")
                ax.plot(future, prediction[col, :, c], color="tab:red", linewidth=1, label="forecast")
                ax.xaxis.set_major_formatter(ConciseDateFormatter(ax.xaxis.get_major_locator()))
                ax.tick_params(labelsize=7)
                if col == 0:
                    ax.set_ylabel(self.output_names[c], fontsize=8)
            axes[0, col].set_title(f"test window {i}: forecast from {future[0]:%Y-%m-%d %H:%M}", fontsize=8)
        axes[0, 0].legend(loc="upper left", fontsize=7)
        scaled = [name for name, values in self.METRIC_VALUES.items() if values == "scaled"]
        unscaled = [name for name, values in self.METRIC_VALUES.items() if values == "unscaled"]
        fig.suptitle(f"tsf, mode {self.cfg.data.mode}, attention {attention_label(self.cfg)}\n"
                     f"scaled: {format_metrics(figures, scaled)}\nunscaled: {format_metrics(figures, unscaled)}",
                     fontsize=8)
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "forecasts.png")
