"""Running a validated configuration with Lightning, one job per module:

- `rundir`: the run folder (`RunDir`), which owns config.yaml, spec.json, checkpoints/,
  the logs, metrics.json and the eval/ folders;
- `checkpoints`: writing checkpoints atomically and checking one before use;
- `callbacks`: the Lightning callbacks of training (checkpoints, logs, signals);
- `trainer`: the Lightning Trainer from the `trainer.*` keys, and the machine checks;
- `commands`: `train` and `evaluate`;
- `cli`: the command line (exit codes, the train and evaluate commands), with `usage`,
  their help texts.
"""

import importlib

__all__ = ["RunDir", "evaluate", "train"]
_HOMES = {"RunDir": "rundir", "evaluate": "commands", "train": "commands"}


def __getattr__(name):
    """The package's names, each imported from its module on first use: they import
    Lightning, which the command line needs only once a configuration is known good."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
