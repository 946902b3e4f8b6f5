"""Where a result came from: the attention of each site, the code's version, the checkpoint.

The runner writes this next to a result (`metrics.meta.json` beside `metrics.json`) and
into every checkpoint (under the key `lavo_tasks`), so a number can be traced to the run,
model and step that produced it, and `evaluate` can refuse a checkpoint of another model.

A task module may declare `METRIC_VALUES = {"test_mse": "scaled", ...}`: which of its
test metrics are computed on scaled (normalised) values and which on the data's own
units; it is copied into `metrics.meta.json` as `values`.
"""

import importlib.metadata
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from . import tasks
from .config import site_attention

PACKAGE = "lavo-tasks"
# Keys of an attention config that choose how it runs, not what it computes.
RUNTIME_KEYS = ("backend",)


def run_attention(cfg: DictConfig) -> dict[str, dict]:
    """{site: attention config} for every attention site of the run's task model."""
    sites = tasks.load_task(cfg.task).sites
    return {
        site: OmegaConf.to_container(site_attention(cfg, site), resolve=True)
        for site in sites
    }


def code_version() -> dict:
    """The installed package version, and the git commit of the source folder (with
    whether files tracked there differ from it) when it is a git checkout; None where
    unknown."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    source = Path(__file__).resolve().parent.parent
    commit = dirty = None
    try:
        top = _git(source, "rev-parse", "--show-toplevel")
        if Path(top).resolve() == source:  # not some other repository the package sits inside
            commit = _git(source, "rev-parse", "HEAD")
            dirty = bool(_git(source, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "git_commit": commit, "git_dirty": dirty}


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def model_identity(cfg: DictConfig) -> dict:
    """What a checkpoint's weights depend on: the task, the model keys and the attention
    of each site (without the keys that only choose a backend)."""
    attention = {site: {k: v for k, v in a.items() if k not in RUNTIME_KEYS} for site, a in run_attention(cfg).items()}
    return {"task": cfg.task, "model": OmegaConf.to_container(cfg.model, resolve=True), "attention": attention}


def checkpoint_record(cfg: DictConfig) -> dict:
    """The `lavo_tasks` entry of a checkpoint: the run folder and its model identity."""
    return {"run_dir": str(cfg.run.dir), **model_identity(cfg), "code": code_version()}


def first_difference(a, b, prefix: str = "") -> str | None:
    """The dotted key of the first difference between two nested dicts, e.g.
    `model.d_model` (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            found = first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if a == b else prefix.rstrip(".")


def result_meta(cfg: DictConfig, *, command: str, checkpoint: dict, metric_values: dict[str, str],
                overrides: dict | None = None) -> dict:
    """The contents of metrics.meta.json. `checkpoint`: {name, path, step} of the weights
    tested; `overrides`: the test-time keys evaluate changed from the run's config."""
    meta = {
        "command": command,
        "run_dir": str(cfg.run.dir),
        "task": cfg.task,
        "checkpoint": checkpoint,
        "attention": run_attention(cfg),
        "data_path": cfg.data.path,
        "values": metric_values,
        "code": code_version(),
    }
    if overrides:
        meta["overrides"] = overrides
    return meta
