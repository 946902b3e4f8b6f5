"""Runs a researcher can trust: interruption and resume, the final validation, the
provenance of results, evaluate's own folder and test-time keys, the training log, file
modes, and the bad inputs that must stop as one line (exit code 2) before any work.

Most checks use the tiny task of test_train_cli (seconds per run).
"""

import csv
import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from test_train_cli import (TINY_YAML, TRAIN_LOADER_STARTS, TinyModule, read_jsonl, tiny_driver,  # noqa: F401
                            tiny_task, train_until_crash)

import lavo_tasks.config
import lavo_tasks.run.commands
import lavo_tasks.run.trainer
from lavo_tasks import evaluate, train
from lavo_tasks.files import write_atomically
from lavo_tasks.module import TaskModule

ROOT = Path(__file__).resolve().parents[2]


def last_step(run_dir: Path) -> int:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]


class SignalAt(L.Callback):
    """Sends a real signal to this process at the start of a step (as Ctrl-C or a
    cluster's SIGTERM would arrive while the step runs)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def main_with_signal(monkeypatch, args, step, signum=signal.SIGINT) -> int:
    build = lavo_tasks.run.commands.build_trainer

    def signalling_trainer(cfg, run_dir, *, fitting):
        trainer = build(cfg, run_dir, fitting=fitting)
        trainer.callbacks.insert(0, SignalAt(step, signum))
        return trainer

    with monkeypatch.context() as patch:
        patch.setattr(lavo_tasks.run.commands, "build_trainer", signalling_trainer)
        return train.main(args)


# --- interruption, resume, the final validation


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_first_validation_writes_last_ckpt_and_resume_is_exact(tiny_task, tmp_path, monkeypatch,
                                                                                   capsys, signum):
    # (what the process started with: Python's default_int_handler, or SIG_IGN under a
    # shell that starts background jobs with SIGINT ignored)
    sigint_before = signal.getsignal(signal.SIGINT)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    expected = train.run(["task=tiny", f"run.dir={straight}", "trainer.max_steps=8"])
    capsys.readouterr()
    # The signal arrives during step 2 (0-based) of 8; the first validation would be at 3.
    assert main_with_signal(monkeypatch, ["task=tiny", f"run.dir={stopped}", "trainer.max_steps=8"], 1, signum) == (
        128 + signum)
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    assert f"stopped: {name} at step 2: wrote {stopped / 'checkpoints' / 'last.ckpt'}" in err
    assert "run.resume=last" in err.splitlines()[-1]
    assert last_step(stopped) == 2
    assert not (stopped / "metrics.json").exists() and not (stopped / "metrics.jsonl").exists()
    assert signal.getsignal(signal.SIGINT) is sigint_before  # the handlers are put back

    resumed = train.run([f"run.dir={stopped}", "run.resume=last"])
    assert TRAIN_LOADER_STARTS == [0, 0, 2]  # the resumed run continued at step 2
    assert resumed == expected
    assert read_jsonl(stopped / "metrics.jsonl") == read_jsonl(straight / "metrics.jsonl")


def test_a_signal_in_the_last_step_finishes_training_and_skips_the_test(tiny_task, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    assert main_with_signal(monkeypatch, ["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=5"], 4) == 130
    assert last_step(run_dir) == 5 and (run_dir / "checkpoints" / "best.ckpt").is_file()
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [3, 5]
    assert not (run_dir / "metrics.json").exists()
    metrics = train.run([f"run.dir={run_dir}", "run.resume=last"])  # only the test is left
    assert json.loads((run_dir / "metrics.json").read_text()) == metrics


# Steps of at least 20 ms, so that the signal comes while training runs.
DRIVER = tiny_driver("import time\ntiny.TinyModule.on_train_batch_end = lambda self, *args: time.sleep(0.02)")


def test_sigint_to_a_training_process_then_resume(tiny_task, tmp_path):
    """A real Ctrl-C from outside: the process writes last.ckpt, exits 130, and the
    resumed run ends with the metrics of an uninterrupted one."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = ["task=tiny", "trainer.max_steps=30", "trainer.val_check_interval=1000", "trainer.log_every_n_steps=1"]
    stopped = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, str(driver), *args, f"run.dir={stopped}"], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True)
    log = stopped / "logs" / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) > 3:  # a few steps done
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    step = last_step(stopped)
    assert 3 <= step < 30
    assert err.strip().splitlines()[-1].startswith(f"stopped: SIGINT at step {step}: wrote ")
    with open(log) as f:
        assert int(list(csv.DictReader(f))[-1]["step"]) <= step

    # The validation interval exceeds max_steps: said once, and validation comes at the end.
    assert "val_check_interval=1000 > trainer.max_steps=30" in err
    resumed = train.run([f"run.dir={stopped}", "run.resume=last"])
    assert TRAIN_LOADER_STARTS == [step]
    expected = train.run([*args, f"run.dir={tmp_path / 'straight'}"])
    assert resumed == expected
    assert [line["step"] for line in read_jsonl(stopped / "metrics.jsonl")] == [30]
    with open(log) as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row["train_loss"]]
    assert steps == list(range(1, 31))  # one log across the restart, no step twice


def test_checkpoint_every_steps(tiny_task, tmp_path, monkeypatch):
    args = ["task=tiny", "trainer.max_steps=8", "run.checkpoint_every=2"]
    expected = train.run([*args, f"run.dir={tmp_path / 'straight'}"])
    crashed = tmp_path / "crashed"
    train_until_crash(monkeypatch, [*args, f"run.dir={crashed}"], step=5)
    assert last_step(crashed) == 4  # the step checkpoint, after the validation at 3
    assert train.run([f"run.dir={crashed}", "run.resume=last"]) == expected
    assert TRAIN_LOADER_STARTS[-1] == 4


def test_a_run_stopped_before_any_checkpoint_starts_afresh(tiny_task, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    args = ["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=4"]
    train_until_crash(monkeypatch, args, step=1)  # killed hard: no checkpoint at all
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "checkpoints").exists()
    capsys.readouterr()
    for again in (args, [f"run.dir={run_dir}", "run.resume=last"]):
        assert train.main(again) == 0
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and "starting afresh" in notes[0], notes
        assert last_step(run_dir) == 4
        for path in (run_dir / "checkpoints").iterdir():  # as if it had never run
            path.unlink()
        (run_dir / "metrics.json").unlink()
    # A run with a checkpoint is still protected.
    assert train.main(["task=tiny", f"run.dir={tmp_path / 'other'}", "trainer.max_steps=1"]) == 0
    assert train.main(["task=tiny", f"run.dir={tmp_path / 'other'}"]) == 2


def test_a_short_run_validates_at_its_end(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=2", "trainer.val_check_interval=5"])
    assert "note: trainer.val_check_interval=5 > trainer.max_steps=2" in capsys.readouterr().err
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [2]
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=False)
    assert best["global_step"] == 2
    assert evaluate.main([f"run.dir={run_dir}", "ckpt=best"]) == 0


# --- model selection: the test scores best.ckpt; early stopping


class ScriptedValidation(TinyModule):
    """val_loss at step s is VAL_LOSS[s] (the real loss is ignored); the buffer `steps`
    counts the training steps the weights have seen, and the test logs it, so the test
    metrics tell which checkpoint's weights were scored."""

    VAL_LOSS = {3: 0.9, 6: 0.4, 9: 0.7, 12: 0.8, 15: 0.3, 18: 0.5}

    def __init__(self, cfg, spec):
        super().__init__(cfg, spec)
        self.register_buffer("steps", torch.zeros(()))

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.tensor(self.VAL_LOSS.get(self.global_step, 1.0)))  # 1.0: the sanity check

    def test_step(self, batch, batch_idx):
        super().test_step(batch, batch_idx)
        self.log("test_weights_step", self.steps)


@pytest.fixture
def scripted_task(tiny_task, register_task):
    register_task(dataclasses.replace(lavo_tasks.tasks.load_task("tiny"), Module=ScriptedValidation), TINY_YAML)


def test_the_test_scores_the_best_validation_checkpoint(scripted_task, tmp_path):
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=12"])
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [3, 6, 9, 12]
    assert last_step(run_dir) == 12
    assert metrics["test_weights_step"] == 6  # val_loss 0.4 at step 6, the lowest
    meta = json.loads((run_dir / "metrics.meta.json").read_text())
    assert meta["checkpoint"] == {"name": "best", "path": str(run_dir / "checkpoints" / "best.ckpt"), "step": 6}


def test_early_stopping_after_patience_validations_without_improvement(scripted_task, tmp_path):
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=18",
                         "trainer.early_stopping_patience=2"])
    # best at 6; 9 and 12 are no better, so training stops at 12 (15 would have been better).
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [3, 6, 9, 12]
    assert last_step(run_dir) == 12 and metrics["test_weights_step"] == 6
    # Off (0), the same run goes on to its best point at 15.
    metrics = train.run(["task=tiny", f"run.dir={tmp_path / 'full'}", "trainer.max_steps=18"])
    assert metrics["test_weights_step"] == 15


@pytest.mark.parametrize("value", ["-1", "1.5", "true"])
def test_early_stopping_patience_must_be_a_count(tiny_task, tmp_path, capsys, value):
    assert train.main(["task=tiny", f"run.dir={tmp_path / 'run'}", f"trainer.early_stopping_patience={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: trainer.early_stopping_patience=") and value in err[0].lower()
    assert not (tmp_path / "run" / "checkpoints").exists()


# --- provenance


class DeclaringModule(TinyModule):
    METRIC_VALUES = {"test_loss": "scaled", "test_acc": "unscaled"}


def test_metrics_meta_records_checkpoint_attention_and_code(tiny_task, tmp_path, register_task):
    register_task(dataclasses.replace(lavo_tasks.tasks.load_task("tiny"), Module=DeclaringModule), TINY_YAML)
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tiny", "attention=lavo", "attention.window=6", "attention.rank=4", f"run.dir={run_dir}",
                         "trainer.max_steps=4"])
    assert json.loads((run_dir / "metrics.json").read_text()) == metrics  # still flat {name: number}
    meta = json.loads((run_dir / "metrics.meta.json").read_text())
    assert meta["command"] == "train" and meta["task"] == "tiny" and meta["run_dir"] == str(run_dir)
    assert meta["checkpoint"] == {"name": "best", "path": str(run_dir / "checkpoints" / "best.ckpt"), "step": 4}
    lavo = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "attention" / "lavo.yaml").attention)
    assert meta["attention"] == {"attention": {**lavo, "window": 6, "rank": 4}}
    assert meta["values"] == {"test_loss": "scaled", "test_acc": "unscaled"}
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert meta["code"]["git_commit"] == head.strip() and isinstance(meta["code"]["git_dirty"], bool)
    assert meta["code"]["version"] == "0.1.0"
    record = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["lavo_tasks"]
    assert record["run_dir"] == str(run_dir) and record["task"] == "tiny"
    assert record["attention"]["attention"]["window"] == 6 and "backend" not in record["attention"]["attention"]


# --- evaluate: its own folder, test-time keys, checkpoint checks


def test_evaluate_test_time_keys(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=4"])
    other = tmp_path / "other.txt"
    pairs = [(i % 11, (5 * i + 1) % 11) for i in range(80)]
    other.write_text("".join(f"{a} {b}\n" for a, b in pairs))
    metrics = evaluate.run([f"run.dir={run_dir}", f"data.path={other}", "trainer.limit_test_batches=2"])
    (folder,) = (run_dir / "eval").iterdir()
    meta = json.loads((folder / "metrics.meta.json").read_text())
    assert meta["overrides"] == {"data.path": str(other), "trainer.limit_test_batches": 2}
    assert OmegaConf.load(run_dir / "config.yaml").data.path == ""  # the run's config is unchanged

    # Reference: the checkpoint's weights on the test rows (32..63: two batches of 16) of the file.
    net = TinyModule(OmegaConf.load(run_dir / "config.yaml"), json.loads((run_dir / "spec.json").read_text())).net
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()  # no dropout
    table = torch.tensor(pairs)[32:64]
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(net(b[:, 0]), b[:, 1]).item() for b in table.split(16)]
    assert metrics["test_loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)

    capsys.readouterr()
    refused = [(["model.d_model=32"], "model.d_model: evaluate keeps the run's model"),
               (["trainer.max_steps=9"], "trainer.max_steps: evaluate keeps"),
               (["task=lm"], "task='lm': evaluate keeps the run's task"),
               (["data.vocab=5"], "data.vocab: evaluate keeps")]
    for args, message in refused:
        assert evaluate.main([f"run.dir={run_dir}", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert len(list((run_dir / "eval").iterdir())) == 1


def test_evaluate_refuses_what_is_not_this_runs_checkpoint(tiny_task, tmp_path, capsys):
    run_dir, other = tmp_path / "run", tmp_path / "wider"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
    train.run(["task=tiny", f"run.dir={other}", "trainer.max_steps=1", "model.d_model=24"])
    notes = tmp_path / "notes.txt"
    notes.write_text("not weights\n")
    unrecorded = tmp_path / "unrecorded.ckpt"
    checkpoint = torch.load(other / "checkpoints" / "last.ckpt", weights_only=False)
    del checkpoint["lavo_tasks"]
    torch.save(checkpoint, unrecorded)
    capsys.readouterr()
    cases = [
        (notes, f"ckpt='{notes}': {notes} is not a checkpoint (torch.load: "),
        (other / "checkpoints" / "last.ckpt",
         f"ckpt='{other / 'checkpoints' / 'last.ckpt'}': a checkpoint of run {other} (task tiny), whose model.d_model "
         f"is 24; run.dir='{run_dir}' has 16"),
        (unrecorded, f"ckpt='{unrecorded}': its weights do not fit the model of run.dir='{run_dir}': 2 of another shape (e.g. net.0.weight)"),
    ]
    for ckpt, message in cases:
        assert evaluate.main([f"run.dir={run_dir}", f"ckpt={ckpt}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (run_dir / "eval").exists()


# --- files


def test_files_get_the_users_umask(tiny_task, tmp_path):
    previous = os.umask(0o027)
    try:
        write_atomically(tmp_path / "a.txt", lambda f: f.write(b"x"))
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
        os.umask(0o022)
        run_dir = tmp_path / "run"
        train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
        for name in ("config.yaml", "metrics.json", "metrics.meta.json", "checkpoints/last.ckpt", "logs/metrics.csv",
                     "artifacts/loss.png"):
            assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644, name
    finally:
        os.umask(previous)


# --- errors that must be one line, exit code 2, before any work


def one_line_error(capsys, args, command=train) -> str:
    capsys.readouterr()
    assert command.main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err.removeprefix("error: ").rstrip("\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_triton_backend_without_a_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run_dir = tmp_path / "run"
    message = one_line_error(capsys, ["task=lm", "attention=lavo", "attention.backend=triton", f"run.dir={run_dir}"])
    assert message.startswith("attention.backend=triton: the Triton kernels need a CUDA GPU and no CUDA GPU is visible")
    message = one_line_error(capsys, ["task=tsf", "attention=gsa", "attention.backend=triton", f"run.dir={run_dir}"])
    assert message.startswith("attention.backend=triton (at encoder_attention): ")
    assert not run_dir.exists()


def test_more_cpu_processes_than_cores(tiny_task, tmp_path, capsys):
    cores = len(os.sched_getaffinity(0))
    message = one_line_error(capsys, ["task=tiny", "trainer.accelerator=cpu", f"trainer.devices={cores + 1}",
                                      f"run.dir={tmp_path / 'run'}"])
    assert message == (f"trainer.devices={cores + 1}: {cores + 1} CPU processes, but this machine has {cores} cores; "
                       f"use trainer.devices={cores} or fewer")
    assert lavo_tasks.run.trainer.cpu_processes("auto", 4) == 1 and lavo_tasks.run.trainer.cpu_processes("-1", 4) == 4
    assert not (tmp_path / "run").exists()


def test_validation_metrics_are_logged_with_sync_dist(tiny_task, tmp_path, monkeypatch):
    seen = []
    real_log = L.LightningModule.log

    def spy(self, name, value, *args, **kwargs):
        seen.append((name, kwargs.get("sync_dist", False)))
        return real_log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(L.LightningModule, "log", spy)
    train.run(["task=tiny", f"run.dir={tmp_path / 'run'}", "trainer.max_steps=3"])
    assert {sync for name, sync in seen if name == "val_loss"} == {True}
    assert {sync for name, sync in seen if name == "train_loss"} == {False}
    assert issubclass(TinyModule, TaskModule)


def test_value_errors_carry_no_attention_hint_and_pattern_errors_do():
    value_errors = [
        (["attention=lavo", "attention.window=-8"], "model.encoder_attention.window=-8: must be an integer >= 1"),
        (["attention=lavo", "model.n_heads=3"], "model.n_heads=3: must be >= 1 and divide model.d_model=64"),
        (["attention=gsa", "attention.slots=0"], "model.encoder_attention.slots=0: must be an integer >= 1"),
        (["attention=lavo", "attention.basis=foo"], "model.encoder_attention.basis='foo': allowed learned, fixed"),
    ]
    for args, message in value_errors:
        with pytest.raises(lavo_tasks.errors.ConfigError) as info:
            lavo_tasks.config.validate(lavo_tasks.config.compose(["task=tsf", *args]))
        assert str(info.value) == message
    with pytest.raises(lavo_tasks.errors.ConfigError, match=r"set model.cross_attention to another attention"):
        lavo_tasks.config.validate(lavo_tasks.config.compose(["task=tsf", "attention=local"]))


def test_tsf_data_path_must_be_a_csv_file(tmp_path, capsys):
    message = one_line_error(capsys, ["task=tsf", f"data.path={tmp_path}", f"run.dir={tmp_path / 'run'}"])
    assert message == f"data.path='{tmp_path}': a folder; task tsf reads one CSV file (a `date` column, then numeric columns)"
    assert not (tmp_path / "run").exists()


def test_a_header_only_csv_is_named_and_comes_before_lightnings_banner(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("date,a,OT\n")
    done = subprocess.run([sys.executable, "-m", "lavo_tasks.train", "task=tsf", f"data.path={path}",
                           f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr == (f"error: {path}: 0 data rows after the header; a series needs at least two to tell its "
                           "frequency\n")
    assert not (tmp_path / "run" / "config.yaml").exists()


# --- help


def test_help_shows_the_chosen_tasks_keys(capsys):
    assert train.main(["task=tsf", "--help"]) == 0
    text = capsys.readouterr().out
    lines = [line.split() for line in text.splitlines()]
    assert ["data.seq_len=96", "encoder", "input", "steps"] in lines
    assert ["trainer.max_steps=300", "training", "steps"] in lines            # tsf's default, not train.yaml's 200
    assert ["model.cross_attention:", "NC", "(noncausal", "cross-attention)"] in lines
    assert ["attention.rank=16", *"memory slots r = size of the orthonormal basis (1 <= r <= head dim)".split()] in lines
    assert "data.tokenizer" not in text                                      # an lm key
    assert "data.tokenizer=byte" in train.usage(["task=lm"])


# --- artifacts a person can read


def test_tsf_forecast_plot_shows_channels_dates_attention_and_metrics(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    titles, saved = {}, []
    real_savefig = Figure.savefig

    def record(fig, *args, **kwargs):
        titles["suptitle"] = fig._suptitle.get_text() if fig._suptitle else ""
        saved.append([(ax.get_ylabel(), ax.get_title(), ax.xaxis.get_major_formatter().__class__.__name__)
                      for ax in fig.axes])
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    rows = 300
    frame = pd.DataFrame({"date": pd.date_range("2021-03-01", periods=rows, freq="h")})
    for name in ("a", "b", "c", "OT"):
        frame[name] = np.sin(np.arange(rows) / 7 + len(name)) + np.arange(rows) * 0.01
    frame.to_csv(tmp_path / "s.csv", index=False)
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tsf", "attention=lavo", "attention.window=8", "attention.rank=4", "model.d_model=16",
                         "model.n_heads=2", "model.encoder_layers=1", "model.d_ff=16", "data.seq_len=16",
                         "data.label_len=8", "data.pred_len=4", f"data.path={tmp_path / 's.csv'}",
                         "trainer.max_steps=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
                         "trainer.enable_progress_bar=false", f"run.dir={run_dir}"])
    forecast_axes = next(axes for axes in saved if any("forecast from" in title for _, title, _ in axes))
    assert [label for label, _, _ in forecast_axes if label] == ["OT", "a", "b", "c"]  # every channel, target first
    assert {formatter for _, _, formatter in forecast_axes} == {"ConciseDateFormatter"}
    assert any("forecast from 2021-" in title for _, title, _ in forecast_axes)
    title = titles["suptitle"]
    assert "mode M" in title and "lavo(window=8, rank=4, basis=learned, cross_segments=1, memory_bias=0.0)" in title
    assert f"test_mse {metrics['test_mse']:.4g}" in title and f"test_mase {metrics['test_mase']:.4g}" in title
    assert (run_dir / "artifacts" / "forecasts.png").is_file()
    meta = json.loads((run_dir / "metrics.meta.json").read_text())
    assert meta["values"]["test_mse"] == "scaled" and meta["values"]["test_nd"] == "unscaled"
    assert set(meta["values"]) <= set(metrics)
    assert set(meta["attention"]) == {"encoder_attention", "decoder_attention", "cross_attention"}


def test_readable_ylim_keeps_a_small_change_small():
    from matplotlib.figure import Figure

    from lavo_tasks.plots import readable_ylim

    ax = Figure().subplots()
    readable_ylim(ax, [3.10, 3.12])
    low, high = ax.get_ylim()
    assert low < 3.10 and high > 3.12 and (3.12 - 3.10) / (high - low) < 0.1   # matplotlib alone: 0.9
    readable_ylim(ax, [2.0, 20.0])
    low, high = ax.get_ylim()
    assert low < 2.0 and high > 20.0 and (20 - 2) / (high - low) > 0.8


def test_a_saved_figure_is_what_savefig_writes(tmp_path):
    """save_figure drops the placeholder layout engine tight_layout leaves (and with it
    savefig's extra draw): the PNG must be what savefig writes with the engine in place,
    for flat date axes and for 3D axes (whose draw sets their projection)."""
    import datetime

    import numpy as np
    from matplotlib.figure import Figure

    from lavo_tasks.plots import save_figure

    def figure():
        fig = Figure(figsize=(6, 3))
        flat = fig.add_subplot(1, 2, 1)
        days = [datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=h) for h in range(48)]
        flat.plot(days, np.sin(np.arange(48) / 5))
        flat.set_title("a title", fontsize=8)
        cloud = fig.add_subplot(1, 2, 2, projection="3d")
        points = np.random.default_rng(0).normal(size=(100, 3))
        cloud.scatter(*points.T, s=1.5, c=points[:, 2])
        fig.tight_layout()
        return fig

    reference = figure()
    reference.savefig(tmp_path / "reference.png", format="png", dpi=80)
    save_figure(figure(), tmp_path / "saved.png", dpi=80)
    assert (tmp_path / "saved.png").read_bytes() == (tmp_path / "reference.png").read_bytes()
