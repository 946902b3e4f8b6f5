"""Training and evaluation of the forecaster.

Loss: MSE on the scaled forecast steps (Informer). Validation logs `val_loss` (MSE) and
`val_mae`. Test logs `test_mse`, `test_mae` (scaled, Informer protocol), `test_mase`,
`test_smape`, `test_nd` (unscaled, through gluonts), and the same MSE / MAE of two
model-free forecasts on the same windows (tasks.tsf.baselines): persistence
(`test_last_value_mse`, `test_last_value_mae`) and the least-squares linear map fitted on
the training windows (`test_linear_mse`, `test_linear_mae`); and writes
`artifacts/forecasts.png` with all three forecasts against the truth.

Every test figure is a float64 sum over the windows that torchmetrics adds up over the
processes, so each process tests its own share of the windows (lavo_tasks.data.ShardSampler);
`forecasts.png` shows windows of process 0's share.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection
from matplotlib.dates import ConciseDateFormatter
from matplotlib.figure import Figure  # not pyplot: no global backend state is touched
from omegaconf import DictConfig

from ...backbone import encoder_decoder_args
from ...module import TaskModule
from ...plots import attention_label, format_metrics, save_figure
from .baselines import LinearForecast, last_value_forecast
from .metrics import ForecastErrors
from .model import Forecaster

PLOTTED_WINDOWS = 3
PLOTTED_CHANNELS = 7  # M mode: the target and up to 6 other channels (ETTh1 has 7 in all)
FORECASTERS = ("", "last_value_", "linear_")  # the model, then the baselines: test_<prefix>mse / mae


class TSFModule(TaskModule):
    # Which test metrics are on the scaled (z-scored) values, which in the file's units.
    METRIC_VALUES = {**{f"test_{p}{k}": "scaled" for p in FORECASTERS for k in ("mse", "mae")},
                     **{f"test_{k}": "unscaled" for k in ("mase", "smape", "nd")}}

    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: TSFDataModule.spec(), {"columns", "n_outputs", "mean", "std"}."""
        super().__init__(cfg)
        n_inputs, self.n_outputs = len(spec["columns"]), spec["n_outputs"]
        self.model = Forecaster(n_inputs, self.n_outputs, seq_len=cfg.data.seq_len, pred_len=cfg.data.pred_len,
                                **encoder_decoder_args(cfg), instance_norm=cfg.model.instance_norm,
                                linear_shortcut=cfg.model.linear_shortcut, calendar=list(cfg.model.calendar))
        # Unscaling needs the output channels' scaler (the forecast channels are the last
        # n_outputs inputs); the unscaled truth and MASE's scale come with the test batches.
        self.mean = np.asarray(spec["mean"][-self.n_outputs:], dtype=np.float64)
        self.std = np.asarray(spec["std"][-self.n_outputs:], dtype=np.float64)
        self.output_names = spec["columns"][-self.n_outputs:]
        # float64 sums: a test set of ETTh's size at pred_len 720 has ~10^7 elements per channel.
        self.test_errors = nn.ModuleDict({
            prefix or "model": MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}).set_dtype(
                torch.float64)
            for prefix in FORECASTERS
        })
        self.forecast_errors = ForecastErrors()
        self.linear: LinearForecast | None = None

    def on_train_start(self) -> None:
        # A new run's shortcut starts at its least-squares fit on every training window
        # (a resumed run has its trained weights: this hook runs after they are restored).
        if self.global_step == 0 and self.model.shortcut is not None:
            data = self.cfg.data
            values = self.trainer.datamodule.datasets["train"].values  # [rows, C] scaled, on the CPU
            windows = values.unfold(0, data.seq_len + data.pred_len, 1).transpose(1, 2)  # [N, seq_len + pred_len, C] view
            self.model.fit_shortcut(windows[:, :data.seq_len], windows[:, data.seq_len:])  # solved on the CPU
            if self.trainer.ckpt_path is None:
                self.validate_start()

    def validate_start(self) -> None:
        """Validate, and so checkpoint, the fitted shortcut at step 0, before any training
        step (the head starts at zero, so the model is the shortcut alone): best.ckpt then
        holds the shortcut unless training lowers val_loss below it, and early stopping
        counts from it. Runs the fit loop's own validation, as Lightning does every
        val_check_interval steps."""
        trainer = self.trainer
        first_loop_iter = trainer._logger_connector._first_loop_iter
        trainer.validating = True
        trainer.fit_loop.epoch_loop.val_loop.run()
        trainer.training = True
        trainer._logger_connector._first_loop_iter = first_loop_iter

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
        for errors in self.test_errors.values():
            errors.reset()
        self.forecast_errors.reset()
        # The linear baseline: fitted here on the training rows of the forecast channels.
        train = self.trainer.datamodule.datasets["train"].values[:, -self.n_outputs:]  # [rows, n_outputs] scaled
        self.linear = LinearForecast(self.cfg.data.seq_len, self.cfg.data.pred_len).fit(train.double().numpy())
        # A few evenly spaced windows of those this process reads, plotted at the end.
        loader = self.trainer.test_dataloaders
        shard = list(loader.sampler)  # the test windows of this process, in order
        seen = min(len(shard), self.trainer.num_test_batches[0] * loader.batch_size)
        positions = np.linspace(0, seen - 1, PLOTTED_WINDOWS).round().astype(int) if seen else []
        self.plotted = dict.fromkeys(shard[p] for p in positions)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        prediction, truth = self.forecast(batch)
        prediction = prediction.float()
        history = batch["x"][:, :, -self.n_outputs:]  # [B, seq_len, n_outputs]
        forecasts = {"": prediction, "last_value_": last_value_forecast(history, truth.shape[1]),
                     "linear_": self.linear(history)}
        for prefix, forecast in forecasts.items():
            self.test_errors[prefix or "model"].update(forecast.double().contiguous(), truth.double().contiguous())

        self.forecast_errors.update(self.unscale(prediction), batch["y_raw"], batch["seasonal_error"])
        for row, index in enumerate(batch["index"].tolist()):
            if index in self.plotted:  # input, truth, forecasts in the file's units; the first forecast row
                self.plotted[index] = [self.unscale(part[row]).cpu().numpy()
                                       for part in (history, truth, *forecasts.values())]
                self.plotted[index].append(int(batch["start"][row]))

    def on_test_epoch_end(self) -> None:
        figures = {f"test_{prefix}{k}": float(v) for prefix in FORECASTERS
                   for k, v in self.test_errors[prefix or "model"].compute().items()}
        figures |= {f"test_{k}": v for k, v in self.forecast_errors.compute().items()}
        for name, value in figures.items():
            self.log(name, value)
        if self.trainer.is_global_zero:
            self.plot_forecasts(figures)

    def unscale(self, values: torch.Tensor) -> torch.Tensor:
        """[..., n_outputs] scaled -> float64 in the file's units, on values' device."""
        std, mean = (torch.as_tensor(a, device=values.device) for a in (self.std, self.mean))
        return values.detach().double() * std + mean

    def plot_forecasts(self, figures: dict[str, float]) -> None:
        """A few evenly spaced test windows (columns) by forecast channel (rows: the
        target, and in M mode up to PLOTTED_CHANNELS - 1 others, evenly chosen): the
        encoder's input, the truth, the forecast and both baselines in the file's units
        against the rows' dates; the title gives the attention and the test metrics."""
        windows = {i: parts for i, parts in self.plotted.items() if parts is not None}
        indices = list(windows)
        # [windows, seq_len | pred_len, n_outputs] each, in the file's units
        history, truth, prediction, last_value, linear = (np.stack([windows[i][k] for i in indices]) for k in range(5))
        starts = [windows[i][5] for i in indices]
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
                ax.plot(future, last_value[col, :, c], color="tab:green", linewidth=1, linestyle=":",
                        label="last value")
                ax.plot(future, linear[col, :, c], color="tab:blue", linewidth=1, linestyle="--", label="linear")
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
