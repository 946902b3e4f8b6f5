"""`python -m lavo_tasks.train [task=NAME] [attention=NAME] [key=value ...]`: train, then test.
With `--multirun` (or `-m`), comma lists of values make a grid of runs (lavo_tasks.sweep).

In Python: `lavo_tasks.train.run(["task=lm", "trainer.max_steps=50"])` returns the test
metrics (and raises ConfigError for bad arguments, Interrupted on a signal, Diverged on
non-finite gradients); `main(argv)` is the command itself, `usage(argv)` its help text.
The command is lavo_tasks.run.cli's; this module is its `python -m` entry point.
"""

import sys

from .run.cli import run_train as run
from .run.cli import train_main as main
from .run.usage import train_usage as usage

__all__ = ["main", "run", "usage"]

if __name__ == "__main__":
    sys.exit(main())
