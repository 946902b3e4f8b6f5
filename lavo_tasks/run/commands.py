"""The two commands on a validated configuration: `train` (fit, or continue with
run.resume, then test best.ckpt) and `evaluate` (test one checkpoint of a run).

last.ckpt is written after every validation, every `run.checkpoint_every` steps, at the
end of training, and on SIGINT / SIGTERM (Ctrl-C, a cluster's preemption): the step in
progress finishes, last.ckpt is written and the command exits with 128 + the signal's
number; `run.resume=last` then continues exactly. A second signal stops at once.
"""

import resource
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from .. import tasks
from ..errors import Interrupted
from ..provenance import result_meta
from ..quiet import quiet_lightning
from .callbacks import SignalCheckpoint
from .checkpoints import check_checkpoint_owner, check_weights_fit, read_checkpoint
from .console import notice
from .rundir import CHECKPOINT_NAMES, RunDir
from .trainer import build_trainer, check_machine, held_lightning_info


@quiet_lightning()
def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (or continue, with run.resume) and test best.ckpt; returns the test metrics."""
    started = time.perf_counter()
    run_dir = RunDir.of(cfg)
    run_dir.check_fresh(cfg)
    resume = run_dir.resume_checkpoint(cfg)
    argument = f"run.resume={cfg.run.resume!r}"
    checkpoint = read_checkpoint(resume, argument) if resume else None
    if checkpoint is not None:
        check_checkpoint_owner(cfg, checkpoint, argument)
    check_machine(cfg)
    if cfg.trainer.val_check_interval > cfg.trainer.max_steps:
        notice(f"trainer.val_check_interval={cfg.trainer.val_check_interval} > trainer.max_steps="
               f"{cfg.trainer.max_steps}: the run validates once, after its last step")
    with held_lightning_info() as banner:
        trainer = build_trainer(cfg, run_dir, fitting=True)  # Lightning checks the trainer.* keys
    with run_dir.created():
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        # A resumed run keeps the spec its checkpoint was built from.
        datamodule, module, spec = build_task(cfg, run_dir.read_spec() if cfg.run.resume else None)
        if checkpoint is not None:
            check_weights_fit(module, checkpoint, argument, cfg.run.dir)
            del checkpoint  # Lightning reads it again to restore the run
        # Written once the data spec is known: a run stopped by a bad data file leaves no
        # config.yaml, so the same command works again once the file is fixed.
        run_dir.write_config(cfg)
        run_dir.write_spec(spec)
        banner.release()
        fit(trainer, module, datamodule, resume, run_dir)
        best = run_dir.checkpoints / "best.ckpt"  # every training ends on a validation, so it exists
        tested = {"name": "best", "path": str(best), "step": int(read_checkpoint(best, "best").get("global_step", -1))}
        results = trainer.test(module, datamodule=datamodule, ckpt_path=str(best), verbose=False)
        meta = result_meta(cfg, command="train", checkpoint=tested, metric_values=metric_values(module))
        meta["resources"] = resources(module, started, bool(resume), trainer.strategy.root_device.type == "cuda")
        return RunDir.write_results(run_dir.path, results, meta)


def fit(trainer: L.Trainer, module, datamodule, resume: Path | None, run_dir: RunDir) -> None:
    """trainer.fit with the signal handlers of SignalCheckpoint installed; Interrupted when
    a signal arrived (during the last step: training is complete, the test is skipped)."""
    stopper = next(c for c in trainer.callbacks if isinstance(c, SignalCheckpoint))
    with warnings.catch_warnings(), stopper.catching_signals():
        # On resume Lightning warns that checkpoints/ is not empty: it is meant to be.
        warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=None if resume is None else str(resume))
    if stopper.signum is not None:
        raise Interrupted(stopper.signum, trainer.global_step, run_dir.path)


@quiet_lightning()
def evaluate(cfg: DictConfig, ckpt: str, overrides: dict | None = None) -> dict[str, float]:
    """Test the checkpoint `ckpt` (last, best or a path) of the run in cfg.run.dir; the
    result goes to a new eval/<ckpt>-<time>/ folder of the run. `overrides`: the
    test-time keys changed from the run's config (recorded with the result)."""
    run_dir = RunDir(cfg.run.dir)
    argument = f"ckpt={ckpt!r}"
    path = run_dir.checkpoint(ckpt)
    checkpoint = read_checkpoint(path, argument)
    check_checkpoint_owner(cfg, checkpoint, argument)
    check_machine(cfg)
    with held_lightning_info() as banner:
        trainer = build_trainer(cfg, run_dir, fitting=False)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, module, _ = build_task(cfg, run_dir.read_spec())
    check_weights_fit(module, checkpoint, argument, cfg.run.dir)
    with run_dir.created(run_dir.eval_dir(ckpt)) as out_dir:
        module.results_dir = out_dir
        banner.release()
        results = trainer.test(module, datamodule=datamodule, ckpt_path=str(path), verbose=False)
        tested = {"name": ckpt if ckpt in CHECKPOINT_NAMES else "path", "path": str(path),
                  "step": int(checkpoint.get("global_step", -1))}
        meta = result_meta(cfg, command="evaluate", checkpoint=tested, metric_values=metric_values(module),
                           overrides=overrides)
        return RunDir.write_results(out_dir, results, meta)


def build_task(cfg: DictConfig, spec: dict | None = None):
    """The task's DataModule and Module. The Module is built from the config and the data
    spec alone: `spec` when given (a saved run's), else the DataModule's `spec()`, which
    reads what it needs of the training data."""
    task = tasks.load_task(cfg.task)
    datamodule = task.DataModule(cfg)
    if spec is None:
        spec = datamodule.spec()
    return datamodule, task.Module(cfg, spec), spec


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
