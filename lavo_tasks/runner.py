"""Run a validated configuration with Lightning: train then test, or test a checkpoint.

A run folder (`run.dir`) holds `config.yaml` (the resolved configuration) and
`spec.json` (the data spec, see lavo_tasks.task), which together rebuild the model,
`checkpoints/` (`last.ckpt`, `best.ckpt` by `val_loss`), `metrics.jsonl` (one line per validation), `metrics.json` (the final test metrics, flat
`{name: number}`, of best.ckpt: the weights of the best validation, so a longer run cannot
test worse than its best point) with `metrics.meta.json` (which checkpoint and step, the
attention of each site, the code version; for `train` also `resources`: wall time, peak
memory and parameter count, see `resources`), `logs/metrics.csv` (the training log, one file across
resumes), `artifacts/` (the loss curve, and what the task module's test hooks write) and
`eval/<ckpt>-<time>/` (each `evaluate`: its own metrics and artifacts).

last.ckpt is written after every validation, every `run.checkpoint_every` steps, at the
end of training, and on SIGINT / SIGTERM (Ctrl-C, a cluster's preemption): the step in
progress finishes, last.ckpt is written and the command exits with 128 + the signal's
number; `run.resume=last` then continues exactly. A second signal stops at once.
"""

import csv
import io
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from . import tasks
from .errors import ConfigError, Diverged
from .files import write_atomically
from .kernels.common import interpreted
from .plots import attention_label, plot_loss_curve
from .provenance import checkpoint_record, first_difference, model_identity, result_meta, run_attention
from .quiet import StepProgressBar, quiet_lightning, set_fast_matmuls, uses_gpu

# Shared by the processes of one run: Lightning's DDP launcher starts the other ranks by
# running the same command again, and they must agree on the default run.dir.
RUN_STAMP_ENV = "LAVO_TASKS_RUN_STAMP"
EVAL_DIR_ENV = "LAVO_TASKS_EVAL_DIR"
MONITOR = "val_loss"  # every task logs it in validation; best.ckpt minimises it
SPEC_FILE = "spec.json"
CHECKPOINT_KEY = "lavo_tasks"  # a checkpoint's record of the run and model it belongs to


def notice(message: str) -> None:
    """One line on stderr, from the first process only."""
    if rank_zero_only.rank == 0:
        print(f"note: {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """Training stopped on a signal, after writing last.ckpt."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = signal.Signals(signum).name
        super().__init__(f"{name} at step {step}: wrote {run_dir / 'checkpoints' / 'last.ckpt'}; continue with "
                         f"python -m lavo_tasks.train run.dir={run_dir} run.resume=last")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's own save goes through an fsspec transaction that writes to the system
    temp folder and then moves the file; when that folder is on another file system the
    move is a copy straight onto the checkpoint's name, which a crash can truncate. This
    writes the temporary file in the checkpoint's own folder and renames it."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: torch.save(checkpoint, f))


class RunCheckpoint(ModelCheckpoint):
    """Checkpoints after every validation (`last.ckpt`, and `best.ckpt` by val_loss), and
    once more at the end of training when it did not end on a validation, so `last.ckpt`
    always holds the weights the final test saw. Every checkpoint records the run and
    model it belongs to under `lavo_tasks` (see lavo_tasks.provenance)."""

    def __init__(self, dirpath: Path, cfg: DictConfig):
        super().__init__(dirpath=dirpath, filename="best", monitor=MONITOR, mode="min", save_top_k=1,
                         save_last=True, auto_insert_metric_name=False, enable_version_counter=False)
        self.record = checkpoint_record(cfg)

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


def resolve_run_dir(cfg: DictConfig) -> Path:
    """run.dir, filled in with the default runs/<task>/<YYYYmmdd-HHMMSS> when empty."""
    if not cfg.run.dir:
        if rank_zero_only.rank == 0:  # the other DDP ranks, started later, take rank 0's stamp
            os.environ[RUN_STAMP_ENV] = time.strftime("%Y%m%d-%H%M%S")
        cfg.run.dir = f"runs/{cfg.task}/{os.environ[RUN_STAMP_ENV]}"
    return Path(cfg.run.dir)


def has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob("*.ckpt"))


def check_fresh(cfg: DictConfig, run_dir: Path) -> None:
    """A new run must not write over an old one (its config.yaml marks it), unless the
    old one stopped before it wrote anything to keep: no checkpoint and no test metrics."""
    if rank_zero_only.rank != 0 or cfg.run.resume or not (run_dir / "config.yaml").exists():
        return
    if has_checkpoint(run_dir) or (run_dir / "metrics.json").exists():
        raise ConfigError(f"run.dir={cfg.run.dir!r}: holds a run already; continue it with run.resume=last "
                          "or choose another run.dir")
    notice(f"run.dir={cfg.run.dir!r} holds a config.yaml but no checkpoint (a run stopped before its first): "
           "starting afresh")


def write_run_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write the resolved config.yaml (rank 0 only)."""
    if rank_zero_only.rank != 0:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = cfg.copy()
    saved.run.resume = ""  # config.yaml describes the run, not how this process started
    write_atomically(run_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(saved).encode()))


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> str | None:
    """The checkpoint run.resume names; None (start afresh, with a notice) for `last`
    when the run stopped before its first checkpoint."""
    if not cfg.run.resume:
        return None
    path = run_dir / "checkpoints" / "last.ckpt" if cfg.run.resume == "last" else Path(cfg.run.resume)
    if cfg.run.resume == "last" and not path.is_file():
        notice(f"run.resume=last: {path} does not exist (the run stopped before its first checkpoint): "
               "starting afresh from step 0 with the saved config.yaml")
        return None
    if not path.is_file():
        raise ConfigError(f"run.resume={cfg.run.resume!r}: no checkpoint at {path}")
    return str(path)


def checkpoint_path(run_dir: Path, ckpt: str) -> Path:
    """`last`, `best` or a path -> the checkpoint file."""
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("last", "best") else Path(ckpt)
    if not path.is_file():
        raise ConfigError(f"ckpt={ckpt!r}: no checkpoint at {path}")
    return path


def check_machine(cfg: DictConfig) -> None:
    """What the configuration asks of this machine, before any work: Triton kernels need
    a CUDA GPU (or Triton's interpreter, TRITON_INTERPRET=1); CPU processes are at most
    one per core."""
    gpu = uses_gpu(cfg)
    if not gpu and not interpreted():
        for site, attention in run_attention(cfg).items():
            if attention.get("backend") == "triton":
                where = "" if site == "attention" else f" (at {site})"
                reason = "trainer.accelerator=cpu" if torch.cuda.is_available() else "no CUDA GPU is visible"
                raise ConfigError(f"attention.backend=triton{where}: the Triton kernels need a CUDA GPU and "
                                  f"{reason}; use attention.backend=auto (Triton on a GPU, PyTorch otherwise) or torch")
    if not gpu:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        processes = cpu_processes(cfg.trainer.devices, cores)
        if processes > cores:
            raise ConfigError(f"trainer.devices={cfg.trainer.devices}: {processes} CPU processes, but this machine "
                              f"has {cores} cores; use trainer.devices={cores} or fewer")


def cpu_processes(devices, cores: int) -> int:
    """How many processes Lightning starts on the CPU for `trainer.devices`."""
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            return 1
        if text.lstrip("-").isdigit():
            devices = int(text)
        elif "," in text:
            return len([part for part in text.split(",") if part.strip()])
        else:
            return 1  # Lightning's own error names it
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices)
    return cores if devices == -1 else int(devices)


@contextmanager
def held_lightning_info():
    """Hold back what Lightning logs inside the block (the Trainer's banner: GPU
    available, ...) until `release()` of the object yielded, so that errors found after
    building the trainer (a bad data file) come alone; dropped if never released."""
    logger = logging.getLogger("lightning.pytorch")
    records: list[logging.LogRecord] = []
    collector = logging.Handler()
    collector.emit = records.append
    handlers = logger.handlers[:]
    logger.handlers = [collector]

    class Held:
        @staticmethod
        def release() -> None:
            for record in records:
                for handler in handlers:
                    if record.levelno >= handler.level:
                        handler.handle(record)
            records.clear()

    try:
        yield Held
    finally:
        logger.handlers = handlers


# `trainer.*` keys that configure the run's callbacks rather than lightning.Trainer.
CALLBACK_KEYS = ("early_stopping_patience",)


def early_stopping(cfg: DictConfig) -> list[EarlyStopping]:
    """[EarlyStopping on val_loss] when trainer.early_stopping_patience > 0: training
    stops after that many validations in a row without a lower val_loss; [] when 0."""
    patience = cfg.trainer.early_stopping_patience
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise ConfigError(f"trainer.early_stopping_patience={patience!r}: must be an integer >= 0 "
                          "(validations without a lower val_loss before training stops; 0: never stop early)")
    if patience == 0:
        return []
    return [EarlyStopping(monitor=MONITOR, mode="min", patience=patience, check_on_train_epoch_end=False)]


def build_trainer(cfg: DictConfig, run_dir: Path, *, fitting: bool) -> L.Trainer:
    """A Trainer from the `trainer.*` keys (passed through, `precision: auto` resolved;
    CALLBACK_KEYS configure callbacks), with lavo_tasks.quiet's defaults."""
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    for key in CALLBACK_KEYS:
        kwargs.pop(key)
    stopping = early_stopping(cfg)
    if kwargs["precision"] == "auto":
        kwargs["precision"] = "bf16-mixed" if uses_gpu(cfg) else "32-true"
    set_fast_matmuls(cfg)
    callbacks = []
    if fitting:
        checkpoints = run_dir / "checkpoints"
        title = f"{cfg.task}, attention {attention_label(cfg)}"
        # In this order at each step's end: the logs have its row before a signal stops the run.
        callbacks = [RunCheckpoint(checkpoints, cfg), ValidateAtEnd(), ValidationLog(run_dir / "metrics.jsonl"),
                     TrainingLog(run_dir / "logs" / "metrics.csv", cfg.trainer.log_every_n_steps,
                                 run_dir / "artifacts" / "loss.png", title),
                     SignalCheckpoint(checkpoints / "last.ckpt", cfg.run.checkpoint_every), *stopping]
    if kwargs["enable_progress_bar"]:
        callbacks.append(StepProgressBar())
    try:
        return L.Trainer(
            **kwargs,
            default_root_dir=run_dir,
            logger=False,  # the training log is TrainingLog's logs/metrics.csv
            callbacks=callbacks,
            enable_checkpointing=fitting,
            plugins=[AtomicCheckpointIO()],
            gradient_clip_val=cfg.optim.grad_clip or None,
            check_val_every_n_epoch=None,  # val_check_interval counts steps, across epochs
            # Training batches shard themselves (lavo_tasks.data.StepBatchSampler); every
            # process validates on the whole split, and tests on the whole split or, where
            # the task's test loader shards it (lavo_tasks.data.ShardSampler), on its share.
            use_distributed_sampler=False,
        )
    except (MisconfigurationException, ValueError, TypeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"trainer: {first_line}") from None


def build_task(cfg: DictConfig, spec: dict | None = None):
    """The task's DataModule and Module. The Module is built from the config and the data
    spec alone: `spec` when given (a saved run's), else the DataModule's `spec()`, which
    reads what it needs of the training data."""
    task = tasks.load_task(cfg.task)
    datamodule = task.DataModule(cfg)
    if spec is None:
        spec = datamodule.spec()
    return datamodule, task.Module(cfg, spec), spec


def write_spec(spec: dict, run_dir: Path) -> None:
    """spec.json, the data spec the model was built from (rank 0 only)."""
    if rank_zero_only.rank != 0:
        return
    text = json.dumps(spec, indent=1) + "\n"
    write_atomically(run_dir / SPEC_FILE, lambda f: f.write(text.encode("utf-8")))


def read_spec(run_dir: Path) -> dict:
    path = run_dir / SPEC_FILE
    if not path.is_file():
        raise ConfigError(f"run.dir={str(run_dir)!r}: no {SPEC_FILE} there (the data spec the model was built from)")
    return json.loads(path.read_text(encoding="utf-8"))


def write_results(out_dir: Path, results: list[dict], meta: dict) -> dict[str, float]:
    """metrics.json: the test metrics of every test dataloader, flat {name: number};
    metrics.meta.json: `meta` (lavo_tasks.provenance.result_meta)."""
    metrics = {name: float(value) for result in results for name, value in result.items()}
    if rank_zero_only.rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, content in (("metrics.json", metrics), ("metrics.meta.json", meta)):
            text = json.dumps(content, indent=2, sort_keys=True) + "\n"
            write_atomically(out_dir / name, lambda f: f.write(text.encode()))
        # One table, in place of Lightning's own, which repeats every metric under each
        # test dataloader when a task logs at the end of the test epoch.
        width = max(map(len, metrics), default=0)
        lines = [f"  {name:<{width}}  {value:.6g}" for name, value in sorted(metrics.items())]
        checkpoint = meta["checkpoint"]
        print("\n".join([f"test metrics ({checkpoint['name']}, step {checkpoint['step']}) -> {out_dir / 'metrics.json'}",
                         *lines, f"artifacts -> {out_dir / 'artifacts'}"]))
    return metrics


def metric_values(module) -> dict[str, str]:
    return dict(getattr(module, "METRIC_VALUES", {}))


def resources(module, started: float, resumed: bool, on_gpu: bool) -> dict:
    """`resources` of metrics.meta.json: `wall_s` from the start of `train` to the end of
    its test, in this process only (a resumed run's earlier sessions are not counted:
    `resumed` says so), `peak_memory_bytes` (CUDA's peak allocation on a GPU, else this
    process's peak RSS, which includes Python and torch themselves: `memory` says which),
    and `parameters`, the module's parameter count. Rank 0's figures only."""
    if on_gpu:
        peak, kind = torch.cuda.max_memory_allocated(), "cuda_peak_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_peak_rss"  # Linux: KiB
    return {"wall_s": time.perf_counter() - started, "resumed": resumed, "peak_memory_bytes": int(peak),
            "memory": kind, "parameters": sum(p.numel() for p in module.parameters())}


@quiet_lightning()
def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (or continue, with run.resume) and test; returns the test metrics."""
    started = time.perf_counter()
    run_dir = resolve_run_dir(cfg)
    check_fresh(cfg, run_dir)
    ckpt_path = resume_checkpoint(cfg, run_dir)
    check_machine(cfg)
    if cfg.trainer.val_check_interval > cfg.trainer.max_steps:
        notice(f"trainer.val_check_interval={cfg.trainer.val_check_interval} > trainer.max_steps="
               f"{cfg.trainer.max_steps}: the run validates once, after its last step")
    with held_lightning_info() as banner:
        trainer = build_trainer(cfg, run_dir, fitting=True)  # Lightning checks the trainer.* keys
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    # A resumed run keeps the spec its checkpoint was built from.
    datamodule, module, spec = build_task(cfg, read_spec(run_dir) if cfg.run.resume else None)
    # Written once the data spec is known: a run stopped by a bad data file leaves no
    # config.yaml, so the same command works again once the file is fixed.
    write_run_config(cfg, run_dir)
    write_spec(spec, run_dir)
    banner.release()
    stopper = next(c for c in trainer.callbacks if isinstance(c, SignalCheckpoint))
    with warnings.catch_warnings(), stopper.catching_signals():
        # On resume Lightning warns that checkpoints/ is not empty: it is meant to be.
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    if stopper.signum is not None:  # arrived during the last step: training is complete
        raise Interrupted(stopper.signum, trainer.global_step, run_dir)
    checkpoint = best_checkpoint(run_dir)
    results = trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint["path"], verbose=False)
    meta = result_meta(cfg, command="train", checkpoint=checkpoint, metric_values=metric_values(module))
    meta["resources"] = resources(module, started, bool(ckpt_path), trainer.strategy.root_device.type == "cuda")
    return write_results(run_dir, results, meta)


def best_checkpoint(run_dir: Path) -> dict:
    """{name, path, step} of best.ckpt, the checkpoint of the lowest val_loss (every
    training ends on a validation, so it exists)."""
    path = run_dir / "checkpoints" / "best.ckpt"
    step = int(read_checkpoint(path, "best").get("global_step", -1))
    return {"name": "best", "path": str(path), "step": step}


def read_checkpoint(path: Path, ckpt: str) -> dict:
    """The checkpoint at `path` (memory-mapped: the weights are not read here);
    ConfigError when it is not a Lightning checkpoint."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path))
    except Exception as err:  # torch.load raises many kinds for a file that is no checkpoint
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"ckpt={ckpt!r}: {path} is not a checkpoint (torch.load: {reason})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ConfigError(f"ckpt={ckpt!r}: {path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def check_checkpoint_owner(cfg: DictConfig, checkpoint: dict, ckpt: str) -> None:
    """ConfigError when the checkpoint records a model other than the run's."""
    owner = checkpoint.get(CHECKPOINT_KEY)
    if owner is None:
        return  # written elsewhere: check_weights_fit still compares the weights
    mine = model_identity(cfg)
    key = first_difference({k: owner.get(k) for k in mine}, mine)
    if key:
        theirs, ours = OmegaConf.select(OmegaConf.create(owner), key), OmegaConf.select(OmegaConf.create(mine), key)
        raise ConfigError(f"ckpt={ckpt!r}: a checkpoint of run {owner.get('run_dir')} (task {owner.get('task')}), "
                          f"whose {key} is {theirs!r}; run.dir={cfg.run.dir!r} has {ours!r}")


def check_weights_fit(module, checkpoint: dict, ckpt: str, run_dir: str) -> None:
    """ConfigError when the checkpoint's weights do not fit the module (what strict
    loading would raise, as one line)."""
    own, saved = module.state_dict(), checkpoint["state_dict"]
    missing, unexpected = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
    reshaped = sorted(k for k in own.keys() & saved.keys() if tuple(own[k].shape) != tuple(saved[k].shape))
    if missing or unexpected or reshaped:
        problems = [f"{len(names)} {what} (e.g. {names[0]})" for what, names in
                    (("missing", missing), ("unexpected", unexpected), ("of another shape", reshaped)) if names]
        raise ConfigError(f"ckpt={ckpt!r}: its weights do not fit the model of run.dir={run_dir!r}: "
                          f"{', '.join(problems)}")


def eval_dir(run_dir: Path, ckpt: str) -> Path:
    """A new folder eval/<ckpt name>-<YYYYmmdd-HHMMSS>[-n] of the run (rank 0 chooses it;
    DDP ranks started later read it from the environment)."""
    if rank_zero_only.rank == 0:
        name = ckpt if ckpt in ("last", "best") else Path(ckpt).stem
        base = run_dir / "eval" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        path.mkdir(parents=True)
        os.environ[EVAL_DIR_ENV] = str(path)
    return Path(os.environ[EVAL_DIR_ENV])


@quiet_lightning()
def evaluate(cfg: DictConfig, ckpt: str, overrides: dict | None = None) -> dict[str, float]:
    """Test the checkpoint `ckpt` (last, best or a path) of the run in cfg.run.dir; the
    result goes to a new eval/<ckpt>-<time>/ folder of the run. `overrides`: the
    test-time keys changed from the run's config (recorded with the result)."""
    run_dir = Path(cfg.run.dir)
    path = checkpoint_path(run_dir, ckpt)
    checkpoint = read_checkpoint(path, ckpt)
    check_checkpoint_owner(cfg, checkpoint, ckpt)
    check_machine(cfg)
    with held_lightning_info() as banner:
        trainer = build_trainer(cfg, run_dir, fitting=False)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, module, _ = build_task(cfg, read_spec(run_dir))
    check_weights_fit(module, checkpoint, ckpt, cfg.run.dir)
    out_dir = eval_dir(run_dir, ckpt)
    module.results_dir = out_dir
    banner.release()
    results = trainer.test(module, datamodule=datamodule, ckpt_path=str(path), verbose=False)
    record = {"name": ckpt if ckpt in ("last", "best") else "path", "path": str(path),
              "step": int(checkpoint.get("global_step", -1))}
    meta = result_meta(cfg, command="evaluate", checkpoint=record, metric_values=metric_values(module),
                       overrides=overrides)
    return write_results(out_dir, results, meta)


def run_cli(body, argv: list[str], usage) -> int:
    """Run `body(argv)` as a command: `-h`/`--help` prints `usage(argv)`; a ConfigError
    (bad input) prints `error: <message>` as one line on stderr, no traceback, exit code
    2; Interrupted (a signal, last.ckpt written) and Ctrl-C outside training steps print
    one line too, exit code 128 + the signal's number; Diverged (non-finite
    gradients) prints one line, exit code 1."""
    try:
        if "-h" in argv or "--help" in argv:
            print(usage([arg for arg in argv if arg not in ("-h", "--help")]))
            return 0
        body(argv)
    except ConfigError as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 128 + err.signum
    except Diverged as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped: SIGINT outside a training step, so no checkpoint was written now", file=sys.stderr)
        return 128 + signal.SIGINT
    return 0
