"""The run folder: where each of a run's files lives, and the rules for writing them.

A run folder (`run.dir`) holds `config.yaml` (the resolved configuration) and `spec.json`
(the data spec, see lavo_tasks.task), which together rebuild the model; `checkpoints/`
(`last.ckpt`, `best.ckpt` by `val_loss`); `metrics.jsonl` (one line per validation);
`metrics.json` (the final test metrics, flat `{name: number}`, of best.ckpt: the weights
of the best validation, so a longer run cannot test worse than its best point) with
`metrics.meta.json` (which checkpoint and step, the attention of each site, the code
version; for `train` also `resources`, see lavo_tasks.run.commands.resources);
`logs/metrics.csv` (the training log, one file across resumes); `artifacts/` (the loss
curve, and what the task module's test hooks write); and `eval/<ckpt>-<time>/` (each
`evaluate`: its own metrics and artifacts).

A command that fails on bad input leaves no folder behind: `created()` removes the
folders the command itself created when a ConfigError ends it before any checkpoint.
"""

import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..files import write_atomically
from .console import notice

# Shared by the processes of one run: Lightning's DDP launcher starts the other ranks by
# running the same command again, and they must agree on the default run.dir and eval folder.
RUN_STAMP_ENV = "LAVO_TASKS_RUN_STAMP"
EVAL_DIR_ENV = "LAVO_TASKS_EVAL_DIR"
CHECKPOINT_NAMES = ("last", "best")


class RunDir:
    """One run's folder (see the module docstring for its files)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.config_file = self.path / "config.yaml"
        self.spec_file = self.path / "spec.json"
        self.checkpoints = self.path / "checkpoints"
        self.validation_log = self.path / "metrics.jsonl"
        self.training_log = self.path / "logs" / "metrics.csv"
        self.loss_plot = self.path / "artifacts" / "loss.png"

    @classmethod
    def of(cls, cfg: DictConfig) -> "RunDir":
        """The folder of cfg.run.dir, which is filled in with the default
        runs/<task>/<YYYYmmdd-HHMMSS> when empty."""
        if not cfg.run.dir:
            if rank_zero_only.rank == 0:  # the other DDP ranks, started later, take rank 0's stamp
                os.environ[RUN_STAMP_ENV] = time.strftime("%Y%m%d-%H%M%S")
            cfg.run.dir = f"runs/{cfg.task}/{os.environ[RUN_STAMP_ENV]}"
        return cls(cfg.run.dir)

    def has_checkpoint(self) -> bool:
        return any(self.checkpoints.glob("*.ckpt"))

    def checkpoint(self, ckpt: str, argument: str = "ckpt") -> Path:
        """`last`, `best` or a path -> the checkpoint file; ConfigError naming `argument`
        when there is none."""
        path = self.checkpoints / f"{ckpt}.ckpt" if ckpt in CHECKPOINT_NAMES else Path(ckpt)
        if not path.is_file():
            raise ConfigError(f"{argument}={ckpt!r}: no checkpoint at {path}; expected "
                              f"{' | '.join(CHECKPOINT_NAMES)} | the path of a checkpoint file")
        return path

    def check_fresh(self, cfg: DictConfig) -> None:
        """A new run must not write over an old one (its config.yaml marks it), unless the
        old one stopped before it wrote anything to keep: no checkpoint and no test metrics."""
        if rank_zero_only.rank != 0 or cfg.run.resume or not self.config_file.exists():
            return
        if self.has_checkpoint() or (self.path / "metrics.json").exists():
            raise ConfigError(f"run.dir={cfg.run.dir!r}: holds a run already; continue it with run.resume=last "
                              "or choose another run.dir")
        notice(f"run.dir={cfg.run.dir!r} holds a config.yaml but no checkpoint (a run stopped before its first): "
               "starting afresh")

    def resume_checkpoint(self, cfg: DictConfig) -> Path | None:
        """The checkpoint run.resume names; None (start afresh, with a notice) for `last`
        when the run stopped before its first checkpoint."""
        if not cfg.run.resume:
            return None
        path = self.checkpoints / "last.ckpt" if cfg.run.resume == "last" else Path(cfg.run.resume)
        if cfg.run.resume == "last" and not path.is_file():
            notice(f"run.resume=last: {path} does not exist (the run stopped before its first checkpoint): "
                   "starting afresh from step 0 with the saved config.yaml")
            return None
        if not path.is_file():
            raise ConfigError(f"run.resume={cfg.run.resume!r}: no checkpoint at {path}")
        return path

    @contextmanager
    def created(self, folder: Path | None = None):
        """Create `folder` (default: the run folder; or an eval folder) and check that
        files can be written there, for the duration of the block: when a ConfigError
        (bad input) ends the block, the folders this created are removed again, unless
        a checkpoint was written into them (a trained run is kept whatever its test)."""
        folder = self.path if folder is None else folder
        top = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            if top is not None and top.is_dir() and rank_zero_only.rank == 0:
                shutil.rmtree(top, ignore_errors=True)
            where = f" at {err.filename}" if err.filename and Path(err.filename) != folder else ""
            raise ConfigError(f"run.dir={str(self.path)!r}: cannot write there ({err.strerror}{where}); "
                              "choose a folder you can write to") from None
        try:
            yield folder
        except ConfigError:
            if top is not None and rank_zero_only.rank == 0 and not any(top.rglob("*.ckpt")):
                shutil.rmtree(top, ignore_errors=True)
            raise

    def write_config(self, cfg: DictConfig) -> None:
        """config.yaml, the resolved configuration (rank 0 only)."""
        if rank_zero_only.rank != 0:
            return
        saved = cfg.copy()
        saved.run.resume = ""  # config.yaml describes the run, not how this process started
        write_atomically(self.config_file, lambda f: f.write(OmegaConf.to_yaml(saved).encode()))

    def write_spec(self, spec: dict) -> None:
        """spec.json, the data spec the model was built from (rank 0 only)."""
        if rank_zero_only.rank != 0:
            return
        text = json.dumps(spec, indent=1) + "\n"
        write_atomically(self.spec_file, lambda f: f.write(text.encode("utf-8")))

    def read_spec(self) -> dict:
        if not self.spec_file.is_file():
            raise ConfigError(f"run.dir={str(self.path)!r}: no {self.spec_file.name} there (the data spec the "
                              "model was built from)")
        return json.loads(self.spec_file.read_text(encoding="utf-8"))

    def eval_dir(self, ckpt: str) -> Path:
        """A new folder's path, eval/<ckpt name>-<YYYYmmdd-HHMMSS>[-n] (rank 0 chooses it;
        DDP ranks started later read it from the environment); `created()` makes it."""
        if rank_zero_only.rank == 0:
            name = ckpt if ckpt in CHECKPOINT_NAMES else Path(ckpt).stem
            base = self.path / "eval" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            path, n = base, 1
            while path.exists():
                n += 1
                path = base.with_name(f"{base.name}-{n}")
            os.environ[EVAL_DIR_ENV] = str(path)
        return Path(os.environ[EVAL_DIR_ENV])

    @staticmethod
    def write_results(out_dir: Path, results: list[dict], meta: dict) -> dict[str, float]:
        """metrics.json in `out_dir` (the run folder or an eval folder): the test metrics
        of every test dataloader, flat {name: number}; metrics.meta.json: `meta`
        (lavo_tasks.provenance.result_meta). Prints them as one table."""
        metrics = {name: float(value) for result in results for name, value in result.items()}
        if not metrics:
            raise ConfigError("trainer.limit_test_batches: the test ran no batch, so there are no metrics to write; "
                              "use an integer >= 1 or a fraction in (0, 1] of the test split")
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
            print("\n".join([f"test metrics ({checkpoint['name']}, step {checkpoint['step']}) -> "
                             f"{out_dir / 'metrics.json'}", *lines, f"artifacts -> {out_dir / 'artifacts'}"]))
        return metrics
