"""The LightningModule base every task module extends: optimiser, schedule, run paths."""

import math
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from .compiling import ShapeWatch, compile_mode, compile_model
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

    def configure_model(self) -> None:
        """Compile the task's model (`self.model`) with torch.compile when the config's
        `trainer.compile` is a mode (COMPILE_MODES); the generation paths
        (`self.model.step`, `generate`, ...) stay eager."""
        mode = compile_mode(self.cfg)
        if mode != "off" and not getattr(self, "_compiled", False):
            compile_model(self.model, mode)
            if mode == "reduce-overhead":
                ShapeWatch(self.model, "trainer.compile=reduce-overhead")
            self._compiled = True

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # Dropout and any other randomness in a step depend on (seed, step) only, so a
        # resumed run repeats an uninterrupted one exactly.
        torch.manual_seed(step_seed(self.cfg.seed, self.global_step))

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self._step_loss = loss.detach()  # (the last micro-batch's, with accumulation) for Diverged's message

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip (optim.grad_clip, passed to the Trainer) and watch for a non-finite
        gradient, from one norm of the gradients.

        Reading the norm on the host would synchronise the GPU every step, so whether it
        is finite is copied to the host asynchronously and checked a step late (or when
        the GPU gets there, see `_check_gradients`). A NaN gradient makes the weights NaN
        in the update about to be applied, so the run stops with the step of that
        gradient at the next check, and every checkpoint save and validation waits for
        the pending checks first: no checkpoint ever holds NaN weights. The gradients
        are all-reduced by now, so with several processes every one stops at the same
        step. fp16's loss scaler skips such steps itself."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm"):  # Lightning's default clipping
            norm = torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)  # returns the norm before clipping
        else:  # no clipping, or trainer.gradient_clip_algorithm=value
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if str(self.trainer.precision).startswith("16"):
            return
        self._check_gradients(wait=False)  # the earlier steps' (a step late)
        pending = getattr(self, "_pending_norms", [])
        pending.append(_NormCheck(norm, self.global_step + 1, self._step_loss))
        self._pending_norms = pending

    def _check_gradients(self, wait: bool) -> None:
        """Raise Diverged for the first pending step whose gradient norm was not finite;
        without `wait`, only the steps whose norm has reached the host (the earlier steps
        on a CPU), so that no call waits for the GPU."""
        pending = getattr(self, "_pending_norms", [])
        while pending and (wait or pending[0].ready()):
            check = pending.pop(0)
            if not check.finite():
                pending.clear()
                self._diverged(check.step, check.loss)

    def _diverged(self, step: int, loss: torch.Tensor) -> None:
        best = Path(self.cfg.run.dir) / "checkpoints" / "best.ckpt"
        kept = f"; {best} holds the weights of the best validation before it" if best.is_file() else ""
        raise Diverged(f"the gradients are not finite at step {step} (train_loss {float(loss)} on this "
                       f"process); start a new run.dir with a lower optim.lr or optim.grad_clip above 0, or resume "
                       f"with trainer.precision=32-true{kept}")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self._check_gradients(wait=True)  # never save the weights of a non-finite update

    def on_validation_start(self) -> None:
        self._check_gradients(wait=True)

    def on_train_end(self) -> None:
        self._check_gradients(wait=True)  # the last steps' checks

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


class _NormCheck:
    """One step's gradient norm on its way to the host: whether it is finite, copied
    without blocking (CUDA: into pinned memory, with an event marking the copy's end),
    and the step's number and loss for the message."""

    def __init__(self, norm: torch.Tensor, step: int, loss: torch.Tensor):
        self.step, self.loss = step, loss
        finite = torch.isfinite(norm)
        if finite.is_cuda:
            self._host = torch.empty((), dtype=torch.bool, pin_memory=True)
            self._host.copy_(finite, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = finite, None

    def ready(self) -> bool:
        """Whether `finite` can be read without waiting for the device."""
        return self._event is None or self._event.query()

    def finite(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
        return bool(self._host)
