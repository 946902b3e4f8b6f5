"""Writing files so that a reader never sees half of one."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a new temporary file next to `path`, flush it to disk, then
    rename it to `path`: a crash leaves either the old file or the new one, never a
    truncated one, and nothing behind. The temporary name is unique (mkstemp), so
    processes writing the same path at once, on one machine or several sharing the
    folder, do not write into each other's file."""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
