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

from .commands import evaluate, train
from .rundir import RunDir

__all__ = ["RunDir", "evaluate", "train"]
