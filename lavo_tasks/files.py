"""Writing files so that a reader never sees half of one."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process's umask. The only portable way to read it is to set it, so it is set
    back at once; a thread creating a file at that instant would see the umask 0o022."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a new temporary file next to `path`, flush it to disk, then
    rename it to `path`: a crash leaves either the old file or the new one, never a
    truncated one, and nothing behind. The temporary name is unique (mkstemp), so
    processes writing the same path at once, on one machine or several sharing the
    folder, do not write into each other's file. The file gets the mode `open` would
    give it (0o666 less the umask), not mkstemp's private 0o600."""
    fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
