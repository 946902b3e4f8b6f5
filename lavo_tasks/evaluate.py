"""`python -m lavo_tasks.evaluate run.dir=<run> [ckpt=last|best|<path>] [key=value ...]`: test a checkpoint.

Rebuilds the task from the run's config.yaml, checks that the checkpoint (default `last`)
is one of this model, runs the test and writes the result into a new folder
`<run.dir>/eval/<ckpt>-<time>/` (metrics.json, metrics.meta.json, artifacts/); the
training run's own files are left as they are. Test-time keys may change (another test
file, fewer batches, another precision, decoding: lavo_tasks.config.TEST_KEYS); keys that
would change the model may not.

In Python: `run(args)` returns the test metrics; `main(argv)` is the command itself. The
command is lavo_tasks.run.cli's; this module is its `python -m` entry point.
"""

import sys

from .run.cli import evaluate_main as main
from .run.cli import run_evaluate as run
from .run.usage import evaluate_usage as usage

__all__ = ["main", "run", "usage"]

if __name__ == "__main__":
    sys.exit(main())
