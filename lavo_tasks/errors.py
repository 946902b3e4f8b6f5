"""The errors the CLIs print as one line: bad configuration or input, and divergence.

The CLIs catch them and print the message as one line (no traceback) and exit non-zero,
so a ConfigError's message must name the key, file, line or value and say what is
allowed, and Diverged's the step and what to change.
"""


class ConfigError(ValueError):
    """A configuration key or an input file is wrong; `str(err)` is the user's message."""


class DataError(ConfigError):
    """An input file is malformed: the message names the file (and line/column)."""


class Diverged(RuntimeError):
    """A training step's gradients are NaN or infinite: the run stops before applying
    them, so best.ckpt and last.ckpt keep the weights from before."""
