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
from matplotlib.figure import Figure  # not pyplot: no global backend state is touched
from omegaconf import DictConfig

from ...config import site_attention
from ...files import write_atomically
from ...module import TaskModule
from .metrics import GluonTSErrors, ScaledErrors
from .model import Forecaster

PLOTTED_WINDOWS = 4


class TSFModule(TaskModule):
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
            if index in self.plotted:  # the target channel: input, truth, forecast in the file's units
                self.plotted[index] = [self.unscale(part[row])[..., -1]
                                       for part in (batch["x"][:, :, -self.n_outputs:], truth, prediction)]

    def on_test_epoch_end(self) -> None:
        figures = {f"test_{k}": v for k, v in self.model_errors.compute().items()}
        figures |= {f"test_{k}": v for k, v in self.gluonts_errors.compute().items()}
        figures |= {f"test_last_value_{k}": v for k, v in self.last_value_errors.compute().items()}
        for name, value in figures.items():
            self.log(name, value)
        self.plot_forecasts()

    def unscale(self, values: torch.Tensor) -> np.ndarray:
        """[..., n_outputs] scaled -> float64 numpy in the file's units."""
        return values.detach().double().cpu().numpy() * self.std + self.mean

    def plot_forecasts(self) -> None:
        """The last output channel (the target) of the plotted test windows: the encoder's
        input, the truth and the forecast, in the file's units."""
        windows = {i: parts for i, parts in self.plotted.items() if parts is not None}
        fig = Figure(figsize=(9, 2.2 * len(windows)))
        axes = fig.subplots(len(windows), 1, sharex=True, squeeze=False)
        for ax, (i, (history, truth, prediction)) in zip(axes[:, 0], windows.items()):
            seq_len, pred_len = len(history), len(truth)
            ax.plot(np.arange(seq_len), history, color="0.5", label="input")
            ax.plot(np.arange(seq_len, seq_len + pred_len), truth, color="k", label="truth")
            ax.plot(np.arange(seq_len, seq_len + pred_len), prediction, color="tab:red", label="forecast")
            ax.set_title(f"test window {i}", fontsize=9)
        axes[0, 0].legend(loc="upper left", fontsize=8)
        axes[-1, 0].set_xlabel("step")
        fig.supylabel(self.output_names[-1])
        fig.tight_layout()
        write_atomically(self.artifacts_dir / "forecasts.png", lambda f: fig.savefig(f, format="png", dpi=100))
