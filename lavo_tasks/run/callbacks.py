"""The Lightning callbacks of a training run: checkpoints, the validation and training
logs, the final validation, and the stop on SIGINT / SIGTERM."""

import csv
import io
import json
import signal
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.data import extract_batch_size
from omegaconf import DictConfig

from ..errors import Interrupted
from ..files import write_atomically
from ..plots import plot_loss_curve
from ..provenance import checkpoint_record
from .checkpoints import CHECKPOINT_KEY
from .console import notice

MONITOR = "val_loss"  # every task logs it in validation; best.ckpt minimises it


class RunCheckpoint(ModelCheckpoint):
    """Checkpoints after every validation (`last.ckpt`, and `best.ckpt` by val_loss), and
    once more at the end of training when it did not end on a validation, so `last.ckpt`
    always holds the weights the final test saw. Every checkpoint records the run and
    model it belongs to under `lavo_tasks` (see lavo_tasks.provenance)."""

    def __init__(self, dirpath: Path, cfg: DictConfig):
        super().__init__(dirpath=dirpath, filename="best", monitor=MONITOR, mode="min", save_top_k=1,
                         save_last=True, auto_insert_metric_name=False, enable_version_counter=False)
        self.record = checkpoint_record(cfg)
        # Lightning's "nothing saved yet" is step 0, which would skip a validation at step 0
        # (tsf validates its fitted start before the first training step).
        self._last_global_step_saved = -1

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        checkpoint[CHECKPOINT_KEY] = self.record

    def on_train_end(self, trainer, pl_module) -> None:
        if self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class ValidateAtEnd(Callback):
    """Validation also after the last training step, whatever val_check_interval, so
    best.ckpt exists and the last weights are scored. (Lightning validates after a step
    at which `trainer.should_stop` is set; training ends there anyway.)"""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class SignalCheckpoint(Callback):
    """last.ckpt every `every` steps (0: never between validations), and on SIGINT or
    SIGTERM: the handler only notes the signal; at the end of the step in progress (a
    validation in progress finishes first) last.ckpt is written and Interrupted raised.
    A signal during the last step lets training end normally (its final validation
    writes the checkpoints) and `train` raises Interrupted before the test. With several
    processes, the decision is shared, so all stop at the same step.

    Steps, not minutes: what a run saves then depends on its configuration only, not on
    the machine's speed; the signals cover the time limits of clusters (SLURM sends
    SIGTERM before it kills a job)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, path: Path, every: int):
        self.path, self.every = path, every
        self.signum: int | None = None

    @contextmanager
    def catching_signals(self):
        """Install the handlers for the duration of the block (main thread only: Python
        handles signals there)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self._note_signal) for signum in self.SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _note_signal(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt  # the second one: stop now, without a checkpoint
        self.signum = signum
        notice(f"{signal.Signals(signum).name}: writing last.ckpt after this step, then stopping "
               "(send it again to stop at once)")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stop = self.signum is not None
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop and trainer.global_step < trainer.max_steps:
            self._save(trainer)
            raise Interrupted(self.signum or signal.SIGTERM, trainer.global_step, self.path.parent.parent)
        if not stop and self.every and trainer.global_step % self.every == 0:
            self._save(trainer)

    def _save(self, trainer) -> None:
        with warnings.catch_warnings():  # the whole checkpoint is meant, as ModelCheckpoint writes it
            warnings.filterwarnings("ignore", message="`weights_only` was not set")
            trainer.save_checkpoint(self.path)


class ValidationLog(Callback):
    """Appends `{"step": N, "val_...": x, ...}` to metrics.jsonl after each validation."""

    def __init__(self, path: Path):
        self.path = path

    @rank_zero_only
    def on_train_start(self, trainer, pl_module) -> None:
        # A resumed run restarts at its checkpoint's step (restored by now): drop the lines
        # of validations after it, which the run is about to repeat.
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            kept = [line for line in lines if json.loads(line)["step"] <= trainer.global_step]
            write_atomically(self.path, lambda f: f.write("".join(f"{line}\n" for line in kept).encode()))

    @rank_zero_only
    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(validation_record(trainer)) + "\n")


def validation_record(trainer) -> dict:
    record = {"step": trainer.global_step}
    for name, value in sorted(trainer.callback_metrics.items()):
        if name.startswith("val_"):
            record[name] = float(value)
    return record


class TrainingLog(Callback):
    """`logs/metrics.csv`, one file for the whole run: every `every` steps a row with
    `train_loss` (the loss the step returned), `lr` (of the first parameter group, as
    used by that step) and `samples_per_s` (training samples of all processes per second
    of wall time since the previous row, validation time excluded), and after each
    validation a row with its `val_*` metrics. A resumed run drops the rows after its
    checkpoint's step. At the end of training it plots `artifacts/loss.png`."""

    TRAIN_COLUMNS = ["step", "train_loss", "lr", "samples_per_s"]

    def __init__(self, path: Path, every: int, plot_path: Path, title: str):
        self.path, self.every, self.plot_path, self.title = path, max(int(every), 1), plot_path, title
        self.rows: list[dict] = []
        self.columns = list(self.TRAIN_COLUMNS)
        self.samples, self.since, self.validating_since, self.validation_time = 0, time.perf_counter(), None, 0.0

    @rank_zero_only
    def on_train_start(self, trainer, pl_module) -> None:
        if self.path.exists():
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(dict.fromkeys([*self.TRAIN_COLUMNS, *(reader.fieldnames or [])]))
                self.rows = [{k: _number(v) for k, v in row.items()} for row in reader]
            self.rows = [row for row in self.rows if row["step"] <= trainer.global_step]
        self._rewrite()
        self.samples, self.since, self.validation_time = 0, time.perf_counter(), 0.0  # the sanity check excluded

    @rank_zero_only
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.samples += extract_batch_size(batch) * trainer.world_size
        step = trainer.global_step
        if step % self.every:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        now = time.perf_counter()
        seconds = now - self.since - self.validation_time
        self._add({"step": step, "train_loss": None if loss is None else float(loss),
                   "lr": trainer.optimizers[0].param_groups[0]["lr"],
                   "samples_per_s": self.samples / seconds if seconds > 0 else None})
        self.samples, self.since, self.validation_time = 0, now, 0.0

    @rank_zero_only
    def on_validation_start(self, trainer, pl_module) -> None:
        self.validating_since = time.perf_counter()

    @rank_zero_only
    def on_validation_end(self, trainer, pl_module) -> None:
        if self.validating_since is not None:
            self.validation_time += time.perf_counter() - self.validating_since
            self.validating_since = None
        if not trainer.sanity_checking:
            self._add(validation_record(trainer))

    @rank_zero_only
    def on_train_end(self, trainer, pl_module) -> None:
        plot_loss_curve(self.rows, self.plot_path, self.title)

    def _add(self, row: dict) -> None:
        self.rows.append(row)
        new = [name for name in row if name not in self.columns]
        if new:
            self.columns += new
            self._rewrite()
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)

    def _rewrite(self) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, lambda f: f.write(text.getvalue().encode()))


def _number(text: str):
    if text == "":
        return None
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value
