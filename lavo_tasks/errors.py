"""The one error type a bad configuration or bad input raises.

The CLIs catch it and print its message as one line (no traceback) and exit non-zero,
so the message must name the key, file, line or value and say what is allowed.
"""


class ConfigError(ValueError):
    """A configuration key or an input file is wrong; `str(err)` is the user's message."""


class DataError(ConfigError):
    """An input file is malformed: the message names the file (and line/column)."""
