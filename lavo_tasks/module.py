"""The LightningModule base every task module extends: optimiser, schedule, run paths."""

import math
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from .data import step_seed
from .errors import Diverged


class TaskModule(L.LightningModule):
    """AdamW with linear warm-up and cosine decay (the `optim.*` keys) and the run's
    artifacts folder. Subclasses build the model and implement the steps.

    Validation and test metrics are logged with `sync_dist=True` (the mean over the
    processes), so best.ckpt is chosen on the same number by every process; a metric
    that lavo_tasks.metrics has already summed over the processes is the same on each,
    and so is its mean."""

    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        # Where the test writes artifacts/: the run folder, or evaluate's eval/<ckpt>-<time>/.
        self.results_dir = Path(cfg.run.dir)

    @property
    def artifacts_dir(self) -> Path:
        path = self.results_dir / "artifacts"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _evaluating(self) -> bool:
        return self._trainer is not None and (self.trainer.validating or self.trainer.sanity_checking
                                              or self.trainer.testing)

    def log(self, name: str, value, *args, **kwargs) -> None:
        if self._evaluating():
            kwargs.setdefault("sync_dist", True)
        super().log(name, value, *args, **kwargs)

    def log_dict(self, dictionary, *args, **kwargs) -> None:
        if self._evaluating():  # Lightning's log_dict passes its own sync_dist=False on to log
            kwargs.setdefault("sync_dist", True)
        super().log_dict(dictionary, *args, **kwargs)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # Dropout and any other randomness in a step depend on (seed, step) only, so a
        # resumed run repeats an uninterrupted one exactly.
        torch.manual_seed(step_seed(self.cfg.seed, self.global_step))

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # A non-finite loss has already made the weights NaN through the optimiser step;
        # stop rather than train on for the rest of the run. Every process decides
        # together (one host sync and, with several processes, one all-reduce a step):
        # a process that stopped alone would leave the others waiting in a collective.
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = loss.detach().float().item()
        if self.trainer.strategy.reduce_boolean_decision(math.isfinite(value), all=True):
            return
        what = f"train_loss is {value}" if not math.isfinite(value) else "another process's train_loss is not finite"
        raise Diverged(f"{what} at step {self.global_step}; lower optim.lr, keep optim.grad_clip above 0 or use "
                       f"trainer.precision=32-true (best.ckpt holds the weights of the best validation before it)")

    def configure_optimizers(self):
        opt = self.cfg.optim
        decay, no_decay = [], []
        for p in self.parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)  # no decay on norms, biases, gains
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=opt.lr,
        )
        total = max(int(self.cfg.trainer.max_steps), 1)
        warmup = min(int(opt.warmup_steps), total)

        def lr_factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
