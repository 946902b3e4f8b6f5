"""Forecasting metrics against hand-computed values, the module's test figures against
an independent float64 recomputation, the model's use of the known steps only, and
end-to-end runs of `task=tsf` with every attention."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

import lavo_tasks.run.commands
from compiled_step import assert_whole_compiled_run
from lavo_tasks import evaluate, train
from lavo_tasks.config import compose
from lavo_tasks.tasks.tsf.data import TSFDataModule
from lavo_tasks.tasks.tsf.metrics import ForecastErrors, seasonal_errors
from lavo_tasks.tasks.tsf.module import TSFModule

with warnings.catch_warnings():  # gluonts suggests faster json packages on import
    warnings.simplefilter("ignore")
    from gluonts.evaluation.metrics import calculate_seasonal_error

TINY = ["model.d_model=16", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_ff=32",
        "data.seq_len=16", "data.label_len=8", "data.pred_len=4"]
# Small attention settings for the tiny model (head dim 8).
ATTENTION_ARGS = {
    "softmax": [],
    "lavo": ["attention.window=8", "attention.rank=4"],
    "gsa": ["attention.slots=8"],
    "local": ["attention.window=8", "model.cross_attention=softmax"],  # local has no cross pattern
}


# --- metrics by hand


def forecast_errors(prediction, truth, seasonal_error) -> ForecastErrors:
    errors = ForecastErrors()
    errors.update(*(torch.as_tensor(a) for a in (prediction, truth, seasonal_error)))
    return errors


def test_forecast_errors_by_hand():
    # Two windows, horizon 2, one channel; seasonal errors 2 and 1.
    truth = np.array([[[2.0], [4.0]], [[1.0], [3.0]]])
    prediction = np.array([[[3.0], [4.0]], [[1.0], [1.0]]])
    errors = forecast_errors(prediction[:1], truth[:1], np.array([[2.0]]))
    errors.update(*(torch.as_tensor(a) for a in (prediction[1:], truth[1:], np.array([[1.0]]))))
    figures = errors.compute()
    # absolute errors 1, 0 | 0, 2
    assert figures["mase"] == pytest.approx((1 / 2 + 0 / 2 + 0 / 1 + 2 / 1) / 4)
    assert figures["smape"] == pytest.approx((2 * 1 / 5 + 0 + 0 + 2 * 2 / 4) / 4)
    assert figures["nd"] == pytest.approx((1 + 0 + 0 + 2) / (2 + 4 + 1 + 3))


def test_forecast_errors_keep_channels_apart():
    # [B=1, H=2, C=2]: channel 0 is off by 1 with seasonal error 1, channel 1 off by 4 with 4.
    truth = np.array([[[10.0, 20.0], [10.0, 20.0]]])
    assert forecast_errors(truth + np.array([1.0, 4.0]), truth, np.array([[1.0, 4.0]])).compute()["mase"] == 1.0


def gluonts_figures(prediction: np.ndarray, truth: np.ndarray, seasonal_error: np.ndarray) -> dict[str, float]:
    """The reference: gluonts' own evaluation (gluonts.ev, aggregated over everything),
    each (window, channel) one forecast of H steps, the point forecast as its median."""
    from gluonts.ev.metrics import MASE, ND, SMAPE

    evaluator = (MASE() + SMAPE() + ND())(axis=None)
    evaluator.update({"label": truth.transpose(0, 2, 1).reshape(-1, truth.shape[1]),  # [B * C, H]
                      "0.5": prediction.transpose(0, 2, 1).reshape(-1, prediction.shape[1]),
                      "seasonal_error": seasonal_error.reshape(-1, 1)})  # [B * C, 1]
    values = evaluator.get()
    return {"mase": float(values["MASE[0.5]"]), "smape": float(values["sMAPE[0.5]"]), "nd": float(values["ND[0.5]"])}


def test_forecast_errors_equal_gluonts_and_sum_over_processes():
    rng = np.random.default_rng(0)
    truth = rng.normal(5.0, 2.0, size=(7, 3, 2))  # [windows, horizon, channels]
    prediction = truth + rng.normal(0.0, 1.0, size=truth.shape)
    seasonal_error = rng.uniform(0.5, 2.0, size=(7, 2))
    whole = gluonts_figures(prediction, truth, seasonal_error)
    assert forecast_errors(prediction, truth, seasonal_error).compute() == pytest.approx(whole, rel=1e-12)
    # Two processes' shares (4 and 3 windows, as ShardSampler cuts 7): the states of one
    # merged into the other, as torchmetrics sums them over processes, give the whole.
    assert forecast_errors(prediction[:4], truth[:4], seasonal_error[:4]).compute() != pytest.approx(whole)
    first = forecast_errors(prediction[:4], truth[:4], seasonal_error[:4])
    second = forecast_errors(prediction[4:], truth[4:], seasonal_error[4:])
    for name in ("mase", "smape", "nd"):
        getattr(first, name).merge_state(getattr(second, name))
    assert first.compute() == pytest.approx(whole, rel=1e-12)


def test_seasonal_errors_match_gluonts():
    series = np.random.default_rng(0).normal(size=(60, 2)).cumsum(axis=0)
    starts = np.array([2, 5, 6, 7, 30, 60])
    ours = seasonal_errors(series, starts, seasonality=6)
    for row, s in enumerate(starts):
        for c in range(2):
            assert ours[row, c] == pytest.approx(calculate_seasonal_error(series[:s, c], seasonality=6))


# --- the module's test figures, recomputed independently


def linear_csv(path: Path, rows: int = 200) -> Path:
    """Daily rows; column `a` = row index, `OT` = 2 x row index."""
    i = np.arange(rows)
    pd.DataFrame({"date": pd.date_range("2020-01-01", periods=rows, freq="D"), "a": i, "OT": 2 * i}).to_csv(path, index=False)
    return path


def tiny_config(tmp_path: Path, *args: str):
    cfg = compose(["task=tsf", *TINY, f"run.dir={tmp_path / 'run'}", *args])
    OmegaConf.set_struct(cfg, False)
    return cfg


def test_module_test_figures(tmp_path):
    cfg = tiny_config(tmp_path, f"data.path={linear_csv(tmp_path / 'lin.csv')}", "data.batch_size=5")
    dm = TSFDataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(0)
    module = TSFModule(cfg, dm.spec())
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    figures = trainer.test(module, datamodule=dm, verbose=False)[0]

    # Reference: every test window one at a time, float64 numpy.
    module.eval()
    test = dm.datasets["test"]
    assert len(test) % 5 != 0  # the last batch is smaller
    pred_len, label_len, m = 4, 8, 1  # seasonality of daily data in gluonts: 1
    predictions, truths, past = [], [], []
    with torch.no_grad():
        for i in range(len(test)):
            item = test[i]
            forecast = module.model(item["x"][None], item["x_mark"][None], item["y"][None, :label_len], item["y_mark"][None])
            predictions.append(forecast[0].double().numpy())
            truths.append(item["y"][-pred_len:].double().numpy())
            past.append(int(item["start"]))
    prediction, truth = np.stack(predictions), np.stack(truths)  # [W, pred_len, 2]
    assert figures["test_mse"] == pytest.approx(np.mean((prediction - truth) ** 2), rel=1e-5)
    assert figures["test_mae"] == pytest.approx(np.mean(np.abs(prediction - truth)), rel=1e-5)

    unscaled = prediction * dm.std + dm.mean
    true_values = np.stack([dm.raw[s:s + pred_len] for s in past])
    scale = np.array([[np.mean(np.abs(dm.raw[m:s, c] - dm.raw[:s - m, c])) for c in range(2)] for s in past])
    assert np.allclose(scale, [1.0, 2.0])  # the series rise by 1 and 2 a row
    error = np.abs(unscaled - true_values)
    assert figures["test_mase"] == pytest.approx(np.mean(error / scale[:, None, :]), rel=1e-5)
    assert figures["test_smape"] == pytest.approx(np.mean(2 * error / (np.abs(true_values) + np.abs(unscaled))), rel=1e-5)
    assert figures["test_nd"] == pytest.approx(error.sum() / np.abs(true_values).sum(), rel=1e-5)

    # Repeat-last-value on a line: the error at horizon step h is h rows, h / std in scaled units.
    std = np.sqrt((140**2 - 1) / 12)  # population std of 0..139, the training rows
    h = np.arange(1, pred_len + 1)
    assert figures["test_last_value_mse"] == pytest.approx(np.mean(h**2) / std**2, rel=1e-5)
    assert figures["test_last_value_mae"] == pytest.approx(np.mean(h) / std, rel=1e-5)
    # The linear baseline is exact on a line (its map is fitted on the training rows only).
    assert figures["test_linear_mse"] < 1e-12 and figures["test_linear_mae"] < 1e-6
    assert (tmp_path / "run" / "artifacts" / "forecasts.png").stat().st_size > 10_000


@pytest.mark.parametrize("mode, n_outputs", [("M", 2), ("MS", 1), ("S", 1)])
def test_forecast_uses_only_known_steps(tmp_path, mode, n_outputs):
    cfg = tiny_config(tmp_path, f"data.path={linear_csv(tmp_path / 'lin.csv')}", f"data.mode={mode}")
    dm = TSFDataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    module = TSFModule(cfg, dm.spec()).eval()
    torch.manual_seed(0)  # the head starts at zero (the shortcut alone): weights as training gives it
    torch.nn.init.normal_(module.model.head.weight)
    batch = next(iter(dm.test_dataloader()))
    prediction, truth = module.forecast(batch)
    assert prediction.shape == truth.shape == (32, 4, n_outputs)
    # the truth is the target OT, the last column: 2 x row index, scaled
    rows = batch["start"][:, None] + torch.arange(4)
    assert torch.allclose(truth[..., -1], ((2 * rows - dm.mean[-1]) / dm.std[-1]).float())
    leaked = dict(batch, y=batch["y"].clone())
    leaked["y"][:, 8:] = 100.0  # the steps to forecast
    assert torch.equal(module.forecast(leaked)[0], prediction)
    changed = dict(batch, y=batch["y"].clone())
    changed["y"][:, 7] += 1.0  # the last known step
    assert not torch.equal(module.forecast(changed)[0], prediction)


def test_embedding_reads_only_the_calendar_features_named():
    from lavo_tasks.tasks.tsf.model import SeriesEmbedding

    torch.manual_seed(0)
    embedding = SeriesEmbedding(1, 8, dropout=0.0, calendar=["weekday", "hour"])
    values = torch.randn(2, 5, 1)
    marks = torch.zeros(2, 5, 5, dtype=torch.long)  # month, day, weekday, hour, minute
    base = embedding(values, marks)
    for column, read in [(0, False), (1, False), (2, True), (3, True), (4, False)]:
        moved = marks.clone()
        moved[..., column] = 3
        assert torch.equal(embedding(values, moved), base) is not read, column
    with_no_calendar = SeriesEmbedding(1, 8, dropout=0.0, calendar=[])
    assert len(list(with_no_calendar.calendar.parameters())) == 0


# --- end to end through the runner, on the embedded default series


def check_run(run_dir: Path, metrics: dict) -> None:
    expected = {"test_mse", "test_mae", "test_mase", "test_smape", "test_nd", "test_last_value_mse", "test_last_value_mae",
                "test_linear_mse", "test_linear_mae"}
    assert expected <= set(metrics) and all(np.isfinite(v) for v in metrics.values())
    assert json.loads((run_dir / "metrics.json").read_text()) == pytest.approx(metrics)
    assert (run_dir / "artifacts" / "forecasts.png").is_file()
    assert not (run_dir / "data").exists()  # the default series is read from the default-data cache


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["lavo", "gsa", "local"])
def test_train_few_steps(tmp_path, attention):
    run_dir = tmp_path / attention
    metrics = train.run([
        "task=tsf", f"attention={attention}", *TINY, *ATTENTION_ARGS[attention], f"run.dir={run_dir}",
        "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=3", "trainer.enable_progress_bar=false", "data.batch_size=16",
    ])
    check_run(run_dir, metrics)


@pytest.mark.gpu
def test_a_whole_run_compiled_with_cuda_graphs(tmp_path):
    run_dir = tmp_path / "run"
    metrics = assert_whole_compiled_run([
        "task=tsf", "attention=lavo", *TINY, *ATTENTION_ARGS["lavo"], "trainer.max_steps=3",
        "trainer.val_check_interval=3", "trainer.limit_val_batches=2", "trainer.limit_test_batches=3",
        "trainer.enable_progress_bar=false", "data.batch_size=16",
    ], run_dir)
    check_run(run_dir, metrics)


@pytest.mark.slow
def test_softmax_learns_and_evaluate_reproduces(tmp_path):
    run_dir = tmp_path / "softmax"
    metrics = train.run([
        "task=tsf", "attention=softmax", *TINY, f"run.dir={run_dir}", "optim.warmup_steps=5", "optim.lr=0.01",
        # the transformer alone learns (the shortcut would start the model at its least-squares fit)
        "model.linear_shortcut=false", "trainer.early_stopping_patience=0",
        "trainer.max_steps=40", "trainer.val_check_interval=10", "trainer.limit_val_batches=4",
        "trainer.limit_test_batches=4", "trainer.enable_progress_bar=false", "data.batch_size=16",
    ])
    check_run(run_dir, metrics)
    losses = [json.loads(line)["val_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0]  # measured: 1.23 -> 0.85
    assert evaluate.run([f"run.dir={run_dir}"]) == pytest.approx(metrics)


def periodic_csv(path: Path, rows: int = 400) -> Path:
    """Hourly rows (fewer than an ETTh file: split 70/10/20 %); `OT` of periods 13 and 23 hours
    plus noise (noiseless, a linear map of the last steps would forecast it exactly)."""
    i = np.arange(rows)
    noise = np.random.default_rng(0).normal(0.0, 0.3, size=rows)
    pd.DataFrame({"date": pd.date_range("2020-01-01", periods=rows, freq="h"),
                  "OT": np.sin(2 * np.pi * i / 13) + 0.5 * np.cos(2 * np.pi * i / 23) + noise}).to_csv(path, index=False)
    return path


def nlinear_mse(train: np.ndarray, evaluated: np.ndarray, seq_len: int, pred_len: int) -> float:
    """NLinear (one channel) by plain least squares on every training window, with the
    inputs and targets relative to the window's last input and an intercept; its MSE
    on every window of `evaluated`. Both series 1-d."""
    def pairs(series):
        n = len(series) - seq_len - pred_len + 1
        x = np.stack([series[i:i + seq_len] for i in range(n)])
        y = np.stack([series[i + seq_len:i + seq_len + pred_len] for i in range(n)])
        return np.concatenate([x - x[:, -1:], np.ones((n, 1))], axis=1), y - x[:, -1:]

    inputs, targets = pairs(train)
    weights = np.linalg.lstsq(inputs, targets, rcond=None)[0]  # [seq_len + 1, pred_len]
    inputs, targets = pairs(evaluated)
    return float(np.mean((inputs @ weights - targets) ** 2))


@pytest.mark.slow
def test_step_zero_is_validated_and_kept_when_training_only_hurts(tmp_path):
    # The shortcut alone is validated and checkpointed at step 0; a learning rate of 1 wrecks
    # the transformer at once, so best.ckpt stays the step-0 shortcut and the test scores it.
    run_dir = tmp_path / "run"
    metrics = train.run([
        "task=tsf", *TINY, f"data.path={periodic_csv(tmp_path / 'periodic.csv')}", "data.mode=S", f"run.dir={run_dir}",
        "optim.lr=1.0", "optim.warmup_steps=1", "trainer.max_steps=6", "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2", "trainer.early_stopping_patience=0", "trainer.enable_progress_bar=false",
    ])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 3, 6]
    # (the validation windows, 37 of 400 rows at 70/10/20 %, fit in its 2 batches)
    assert all(r["val_loss"] > records[0]["val_loss"] for r in records[1:])
    assert json.loads((run_dir / "metrics.meta.json").read_text())["checkpoint"]["step"] == 0

    dm = TSFDataModule(tiny_config(tmp_path, f"data.path={tmp_path / 'periodic.csv'}", "data.mode=S"))
    dm.setup("fit")
    train_rows, val_rows, test_rows = (dm.datasets[s].values[:, 0].double().numpy() for s in ("train", "val", "test"))
    assert records[0]["val_loss"] == pytest.approx(nlinear_mse(train_rows, val_rows, 16, 4), rel=1e-3)
    assert metrics["test_mse"] == pytest.approx(nlinear_mse(train_rows, test_rows, 16, 4), rel=1e-3)
    assert metrics["test_mse"] < metrics["test_last_value_mse"]  # (the premise: the shortcut forecasts something)


class CrashAt(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


@pytest.mark.slow
def test_resume_repeats_an_uninterrupted_run(tmp_path, monkeypatch):
    # Training windows are drawn per step (StepBatchSampler from trainer.global_step).
    args = ["task=tsf", *TINY, "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2", "trainer.enable_progress_bar=false", "data.batch_size=8"]
    expected = train.run([*args, f"run.dir={tmp_path / 'straight'}"])

    build = lavo_tasks.run.commands.build_trainer

    def crashing_trainer(cfg, run_dir, *, fitting):
        trainer = build(cfg, run_dir, fitting=fitting)
        trainer.callbacks.insert(0, CrashAt(4))  # after the checkpoint of step 3
        return trainer

    with monkeypatch.context() as patch:
        patch.setattr(lavo_tasks.run.commands, "build_trainer", crashing_trainer)
        with pytest.raises(RuntimeError, match="simulated crash"):
            train.run([*args, f"run.dir={tmp_path / 'crashed'}"])
    resumed = train.run([f"run.dir={tmp_path / 'crashed'}", "run.resume=last"])
    assert resumed == expected


@pytest.mark.slow
def test_cli_bad_csv_is_one_line(tmp_path):
    path = linear_csv(tmp_path / "bad.csv")
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",n/a"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "lavo_tasks.train", "task=tsf", f"data.path={path}", f"run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    # (Lightning's own start-up notes, printed when the trainer is built, may come before it)
    assert done.stderr.strip().splitlines()[-1] == f"error: {path}: line 4, column 'OT': 'n/a' is not a number"
