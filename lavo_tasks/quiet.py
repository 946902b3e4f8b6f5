"""The runner's quiet, fast defaults for Lightning: the step progress bar, the messages
held back, TF32 matmuls on a GPU.

Held back, because the choices they question are deliberate: Lightning's advertising
tip (the runner logs to its own files, `logger=False`); the advice to raise a loader's
`num_workers` (`data.num_workers` says how many, default 0, configs/train.yaml: the
tasks cut their items from tensors in memory); the reminder that a test from a checkpoint
restores no training callbacks (a test needs none); and the deprecation of `LeafSpec` that
Lightning's own code triggers under this torch.
"""

import logging
import warnings
from contextlib import contextmanager

import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from omegaconf import DictConfig

_HELD_WARNINGS = (
    r"The '\w+' does not have many workers",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Be aware that when using `ckpt_path`, callbacks",
)


class _NoTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


_NO_TIP = _NoTip()


def uses_gpu(cfg: DictConfig) -> bool:
    """Whether the run's trainer will run on a CUDA GPU."""
    return torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")


def set_fast_matmuls(cfg: DictConfig) -> None:
    """On a GPU, float32 matmuls in TF32 (`torch.set_float32_matmul_precision("high")`):
    the layers run under bf16 autocast anyway; what stays float32 (the loss, norms,
    a `32-true` run) trades 10 mantissa bits for several times the speed."""
    if uses_gpu(cfg):
        torch.set_float32_matmul_precision("high")


@contextmanager
def quiet_lightning():
    """Inside the block, Lightning's messages above are held back (its other warnings
    and its banner still come)."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addFilter(_NO_TIP)
    try:
        with warnings.catch_warnings():
            for message in _HELD_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        logger.removeFilter(_NO_TIP)


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, counting the run's training steps ("Steps: 120/300"): the
    runner trains for `trainer.max_steps` in one endless epoch, where Lightning's own
    bars show the epoch (`Epoch 0/-2` in its rich bar) and the batches since the
    process started (a resumed run's count starts at 0). Validation and test bars are
    Lightning's."""

    def on_train_epoch_start(self, trainer, *_) -> None:
        bar = self.train_progress_bar  # one bar for the run (made in on_train_start; leave=False)
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step  # tqdm's rate counts from `initial`
        bar.set_description("Steps")
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is not None and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar
