"""Checkpoint files: written atomically, and checked before use, so that a file which is
no checkpoint, or one of another task or model, fails as one line naming the argument
that chose it (`ckpt=...` of evaluate, `run.resume=...` of train)."""

import zipfile
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..files import write_atomically
from ..provenance import first_difference, model_identity

CHECKPOINT_KEY = "lavo_tasks"  # a checkpoint's record of the run and model it belongs to


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


def read_checkpoint(path: Path, argument: str) -> dict:
    """The checkpoint at `path` (memory-mapped: the weights are not read here);
    ConfigError naming `argument` (e.g. "ckpt='best'") when it is not a Lightning
    checkpoint."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path))
    except Exception as err:  # torch.load raises many kinds for a file that is no checkpoint
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{argument}: {path} is not a checkpoint (torch.load: {reason})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ConfigError(f"{argument}: {path} is not a Lightning checkpoint (no state_dict)")
    return checkpoint


def check_checkpoint_owner(cfg: DictConfig, checkpoint: dict, argument: str) -> None:
    """ConfigError when the checkpoint records another task, or a model other than the
    run's (the first key that differs)."""
    owner = checkpoint.get(CHECKPOINT_KEY)
    if owner is None:
        return  # written elsewhere: check_weights_fit still compares the weights
    if owner.get("task") != cfg.task:
        raise ConfigError(f"{argument}: a checkpoint of task {owner.get('task')} (run {owner.get('run_dir')}); "
                          f"run.dir={cfg.run.dir!r} is a run of task {cfg.task}")
    mine = model_identity(cfg)
    key = first_difference({k: owner.get(k) for k in mine}, mine)
    if key:
        theirs, ours = OmegaConf.select(OmegaConf.create(owner), key), OmegaConf.select(OmegaConf.create(mine), key)
        raise ConfigError(f"{argument}: a checkpoint of run {owner.get('run_dir')} (task {owner.get('task')}), "
                          f"whose {key} is {theirs!r}; run.dir={cfg.run.dir!r} has {ours!r}")


def check_weights_fit(module, checkpoint: dict, argument: str, run_dir: str) -> None:
    """ConfigError when the checkpoint's weights do not fit the module (what strict
    loading would raise, as one line)."""
    own, saved = module.state_dict(), checkpoint["state_dict"]
    missing, unexpected = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
    reshaped = sorted(k for k in own.keys() & saved.keys() if tuple(own[k].shape) != tuple(saved[k].shape))
    if missing or unexpected or reshaped:
        problems = [f"{len(names)} {what} (e.g. {names[0]})" for what, names in
                    (("missing", missing), ("unexpected", unexpected), ("of another shape", reshaped)) if names]
        raise ConfigError(f"{argument}: its weights do not fit the model of run.dir={run_dir!r}: "
                          f"{', '.join(problems)}")
