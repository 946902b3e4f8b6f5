"""The errors the CLIs print as one line: bad configuration or input, divergence, a signal.

The CLIs (lavo_tasks.run.cli) catch them, print the message as one line (no traceback)
and exit non-zero, so a ConfigError's message must name the key, file, line or value and
say what is allowed, Diverged's the step and what to change, and Interrupted's how to
continue.
"""

import signal
from pathlib import Path


class ConfigError(ValueError):
    """A configuration key or an input file is wrong; `str(err)` is the user's message."""


class DataError(ConfigError):
    """An input file is malformed: the message names the file (and line/column)."""


class Diverged(RuntimeError):
    """A training step's gradients are NaN or infinite: the run stops before applying
    them, so best.ckpt and last.ckpt keep the weights from before."""


class Interrupted(Exception):
    """Training stopped on a signal, after writing last.ckpt."""

    def __init__(self, signum: int, step: int, run_dir: Path):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = signal.Signals(signum).name
        super().__init__(f"{name} at step {step}: wrote {run_dir / 'checkpoints' / 'last.ckpt'}; continue with "
                         f"python -m lavo_tasks.train run.dir={run_dir} run.resume=last")
