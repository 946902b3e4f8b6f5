"""The Lightning Trainer of a run, and what the run asks of this machine."""

import logging
import os
from contextlib import contextmanager

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..kernels.common import interpreted
from ..plots import attention_label
from ..provenance import run_attention
from ..quiet import StepProgressBar, set_fast_matmuls, uses_gpu
from .callbacks import MONITOR, RunCheckpoint, SignalCheckpoint, TrainingLog, ValidateAtEnd, ValidationLog
from .checkpoints import AtomicCheckpointIO
from .rundir import RunDir


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


# `trainer.*` keys that configure the run's callbacks or its module rather than lightning.Trainer.
CALLBACK_KEYS = ("early_stopping_patience", "compile")


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


def build_trainer(cfg: DictConfig, run_dir: RunDir, *, fitting: bool) -> L.Trainer:
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
        title = f"{cfg.task}, attention {attention_label(cfg)}"
        # In this order at each step's end: the logs have its row before a signal stops the run.
        callbacks = [RunCheckpoint(run_dir.checkpoints, cfg), ValidateAtEnd(), ValidationLog(run_dir.validation_log),
                     TrainingLog(run_dir.training_log, cfg.trainer.log_every_n_steps, run_dir.loss_plot, title),
                     SignalCheckpoint(run_dir.checkpoints / "last.ckpt", cfg.run.checkpoint_every), *stopping]
    if kwargs["enable_progress_bar"]:
        callbacks.append(StepProgressBar())
    try:
        return L.Trainer(
            **kwargs,
            default_root_dir=run_dir.path,
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
