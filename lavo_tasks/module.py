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

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self._step_loss = loss.detach()  # (the last micro-batch's, with accumulation) for Diverged's message

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip (optim.grad_clip, passed to the Trainer) and stop on a non-finite gradient,
        from one norm of the gradients.

        A NaN or infinite gradient would make the weights NaN in the update about to be
        applied: the run stops before it, so no checkpoint ever holds such weights. The
        gradients are all-reduced by now, so with several processes every one stops at
        the same step. fp16's loss scaler skips such steps itself. One host sync a step."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm"):  # Lightning's default clipping
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)  # returns the norm before clipping
        else:  # no clipping, or trainer.gradient_clip_algorithm=value
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if norm.isfinite() or str(self.trainer.precision).startswith("16"):
            return
        step = self.global_step + 1  # the update this would have been, counted as the logs count steps
        best = Path(self.cfg.run.dir) / "checkpoints" / "best.ckpt"
        kept = f"; {best} holds the weights of the best validation before it" if best.is_file() else ""
        raise Diverged(f"the gradients are not finite at step {step} (train_loss {float(self._step_loss)} on this "
                       f"process); start a new run.dir with a lower optim.lr or optim.grad_clip above 0, or resume "
                       f"with trainer.precision=32-true{kept}")

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
