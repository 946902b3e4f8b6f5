"""Run a validated configuration with Lightning: train then test, or test a checkpoint.

A run folder (`run.dir`) holds `config.yaml` (the resolved configuration) and
`spec.json` (the data spec, see lavo_tasks.task), which together rebuild the model,
`checkpoints/` (`last.ckpt`, `best.ckpt` by `val_loss`), `metrics.jsonl` (one line per
validation), `metrics.json` (the final test metrics), `artifacts/` (written by the task
module's test hooks) and `logs/` (training curves, CSV).
"""

import json
import os
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from . import tasks
from .errors import ConfigError
from .files import write_atomically

# Shared by the processes of one run: Lightning's DDP launcher starts the other ranks by
# running the same command again, and they must agree on the default run.dir.
RUN_STAMP_ENV = "LAVO_TASKS_RUN_STAMP"
MONITOR = "val_loss"  # every task logs it in validation; best.ckpt minimises it
SPEC_FILE = "spec.json"


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
    always holds the weights the final test saw."""

    def __init__(self, dirpath: Path):
        super().__init__(dirpath=dirpath, filename="best", monitor=MONITOR, mode="min", save_top_k=1,
                         save_last=True, auto_insert_metric_name=False, enable_version_counter=False)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


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
        record = {"step": trainer.global_step}
        for name, value in sorted(trainer.callback_metrics.items()):
            if name.startswith("val_"):
                record[name] = float(value)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def resolve_run_dir(cfg: DictConfig) -> Path:
    """run.dir, filled in with the default runs/<task>/<YYYYmmdd-HHMMSS> when empty."""
    if not cfg.run.dir:
        if rank_zero_only.rank == 0:  # the other DDP ranks, started later, take rank 0's stamp
            os.environ[RUN_STAMP_ENV] = time.strftime("%Y%m%d-%H%M%S")
        cfg.run.dir = f"runs/{cfg.task}/{os.environ[RUN_STAMP_ENV]}"
    return Path(cfg.run.dir)


def check_fresh(cfg: DictConfig, run_dir: Path) -> None:
    """A new run must not write over an old one (its config.yaml marks it)."""
    if rank_zero_only.rank == 0 and not cfg.run.resume and (run_dir / "config.yaml").exists():
        raise ConfigError(f"run.dir={cfg.run.dir!r}: holds a run already; continue it with run.resume=last "
                          "or choose another run.dir")


def write_run_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write the resolved config.yaml (rank 0 only)."""
    if rank_zero_only.rank != 0:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = cfg.copy()
    saved.run.resume = ""  # config.yaml describes the run, not how this process started
    write_atomically(run_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(saved).encode()))


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> str | None:
    if not cfg.run.resume:
        return None
    path = run_dir / "checkpoints" / "last.ckpt" if cfg.run.resume == "last" else Path(cfg.run.resume)
    if not path.is_file():
        raise ConfigError(f"run.resume={cfg.run.resume!r}: no checkpoint at {path}")
    return str(path)


def checkpoint_path(run_dir: Path, ckpt: str) -> Path:
    """`last`, `best` or a path -> the checkpoint file."""
    path = run_dir / "checkpoints" / f"{ckpt}.ckpt" if ckpt in ("last", "best") else Path(ckpt)
    if not path.is_file():
        raise ConfigError(f"ckpt={ckpt!r}: no checkpoint at {path}")
    return path


def build_trainer(cfg: DictConfig, run_dir: Path, *, fitting: bool) -> L.Trainer:
    """A Trainer from the `trainer.*` keys (passed through, `precision: auto` resolved)."""
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    if kwargs["precision"] == "auto":
        on_gpu = torch.cuda.is_available() and kwargs["accelerator"] in ("auto", "gpu", "cuda")
        kwargs["precision"] = "bf16-mixed" if on_gpu else "32-true"
    callbacks = [RunCheckpoint(run_dir / "checkpoints"), ValidationLog(run_dir / "metrics.jsonl")] if fitting else []
    # Training curves (every trainer.log_every_n_steps) go to logs/version_<n>/metrics.csv,
    # a new version for each start of the run, so a resumed run loses nothing.
    logger = CSVLogger(run_dir, name="logs") if fitting else False
    try:
        return L.Trainer(
            **kwargs,
            default_root_dir=run_dir,
            logger=logger,
            callbacks=callbacks,
            enable_checkpointing=fitting,
            plugins=[AtomicCheckpointIO()],
            gradient_clip_val=cfg.optim.grad_clip or None,
            check_val_every_n_epoch=None,  # val_check_interval counts steps, across epochs
            # Training batches shard themselves (lavo_tasks.data.StepBatchSampler); every
            # process validates and tests on the whole split, so the metrics need no syncing.
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


def write_test_metrics(run_dir: Path, results: list[dict]) -> dict[str, float]:
    """metrics.json: the test metrics of every test dataloader, flat {name: number}."""
    metrics = {name: float(value) for result in results for name, value in result.items()}
    if rank_zero_only.rank == 0:
        text = json.dumps(metrics, indent=2, sort_keys=True) + "\n"
        write_atomically(run_dir / "metrics.json", lambda f: f.write(text.encode()))
        # One table, in place of Lightning's own, which repeats every metric under each
        # test dataloader when a task logs at the end of the test epoch.
        width = max(map(len, metrics), default=0)
        lines = [f"  {name:<{width}}  {value:.6g}" for name, value in sorted(metrics.items())]
        print("\n".join([f"test metrics -> {run_dir / 'metrics.json'}", *lines, f"artifacts -> {run_dir / 'artifacts'}"]))
    return metrics


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (or continue, with run.resume) and test; returns the test metrics."""
    run_dir = resolve_run_dir(cfg)
    check_fresh(cfg, run_dir)
    ckpt_path = resume_checkpoint(cfg, run_dir)
    trainer = build_trainer(cfg, run_dir, fitting=True)  # Lightning checks the trainer.* keys
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    # A resumed run keeps the spec its checkpoint was built from.
    datamodule, module, spec = build_task(cfg, read_spec(run_dir) if cfg.run.resume else None)
    # Written once the data spec is known: a run stopped by a bad data file leaves no
    # config.yaml, so the same command works again once the file is fixed.
    write_run_config(cfg, run_dir)
    write_spec(spec, run_dir)
    with warnings.catch_warnings():
        # On resume Lightning warns that checkpoints/ is not empty: it is meant to be.
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return write_test_metrics(run_dir, trainer.test(module, datamodule=datamodule, verbose=False))


def evaluate(cfg: DictConfig, ckpt: str) -> dict[str, float]:
    """Test the checkpoint `ckpt` (last, best or a path) of the run in cfg.run.dir."""
    run_dir = Path(cfg.run.dir)
    path = checkpoint_path(run_dir, ckpt)
    trainer = build_trainer(cfg, run_dir, fitting=False)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, module, _ = build_task(cfg, read_spec(run_dir))
    with warnings.catch_warnings():
        # Testing needs none of the training callbacks Lightning reminds us of.
        warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks")
        results = trainer.test(module, datamodule=datamodule, ckpt_path=str(path), verbose=False)
    return write_test_metrics(run_dir, results)


def run_cli(body, argv: list[str], usage) -> int:
    """Run `body(argv)` as a command: `-h`/`--help` prints `usage()`; a ConfigError (bad
    input) prints `error: <message>` as one line on stderr, no traceback, exit code 2."""
    if "-h" in argv or "--help" in argv:
        print(usage())
        return 0
    try:
        body(argv)
    except ConfigError as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    return 0
