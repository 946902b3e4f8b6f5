"""The one way this project imports open3d: `from lavo_tasks.open3d import open3d`.

open3d's Linux wheels link against `libusb-1.0.so.0`, which a bare machine (a container,
a cluster node) lacks. The `libusb-package` wheel ships that library; loading it into the
process with RTLD_GLOBAL before `import open3d` lets the dynamic loader resolve open3d's
dependency on it without any system package. Where the system has its own libusb, the
packaged copy is loaded all the same (the same ABI, so either serves).

`load()` does this once and returns the module; a failure raises ImportError naming what
is missing and how to install it. open3d is imported only when first asked for, so
importing this module costs nothing.
"""

import ctypes
import functools
from types import ModuleType

INSTALL_HINT = "pip install open3d==0.20.0 libusb-package==1.0.30.0"


@functools.cache
def load() -> ModuleType:
    """open3d, imported after libusb-1.0 from the libusb-package wheel has been loaded."""
    try:
        import libusb_package
    except ImportError:
        raise ImportError(f"open3d needs libusb-1.0, taken from the libusb-package wheel, which is not installed "
                          f"({INSTALL_HINT})") from None
    library = libusb_package.get_library_path()
    if library is None:
        raise ImportError("libusb-package carries no libusb-1.0 library for this platform; install the system's "
                          "libusb-1.0 (e.g. apt-get install libusb-1.0-0) for open3d")
    try:
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise ImportError(f"libusb-1.0 from libusb-package ({library}) did not load: {err}") from None
    try:
        import open3d
    except ImportError as err:
        if err.name == "open3d":
            raise ImportError(f"open3d is not installed ({INSTALL_HINT})") from None
        raise ImportError(f"open3d did not import (with libusb-1.0 from {library} loaded): {err}") from None
    return open3d


def __getattr__(name: str):
    # `from lavo_tasks.open3d import open3d` imports open3d on first use, not at import time.
    if name == "open3d":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
