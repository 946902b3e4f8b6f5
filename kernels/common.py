"""What the LAVO and GSA folders share: the dtype rules, the smallest tile of Triton's
products, and whether Triton runs in its interpreter.

Only facts that hold for both ops live here. An op's own tile sizes, chunk lengths and
launch settings stay in its folder (`lavo/chunk.py`, `gsa/chunk.py`, ...): they are tuned
per op, and the tests and `benchmarks/` scripts patch them there (docs/design.md §1).
This module imports torch only, so the PyTorch paths use it without Triton installed.
"""

import concurrent.futures
import functools
import os
import threading

import torch

# What the Triton kernels of both ops take; anything else (float64) runs on the PyTorch
# path, which the dispatchers fall back to on the kernels' NotImplementedError.
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Triton's compiled products (tl.dot) take operands at least this wide in every dimension.
MIN_DOT = 16


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype the PyTorch paths compute in and the states accumulate in: float64 if any
    of `dtypes` is float64, else float32 (fp32 accumulation for bf16 and fp16 inputs)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n >= 1 (triton.next_power_of_2 without its per-call
    wrapper, a few µs of host time on every launch)."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0 (triton.cdiv without its per-call wrapper)."""
    return -(-a // b)


def tile_width(n: int) -> int:
    """The width of a Triton tile that holds n >= 1 columns: the smallest power of 2 that
    is >= n, and at least MIN_DOT."""
    return max(MIN_DOT, next_pow2(n))


def interpreted() -> bool:
    """Whether Triton runs its kernels in the interpreter (TRITON_INTERPRET=1, read when
    triton.jit decorates a kernel: the kernel modules ask once, at their import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# Triton's interpreter (numpy 2) cannot run `for` loops with run-time bounds: the kernels
# that loop over one then take a WHILE_LOOPS constexpr and run `while` loops under it,
# which the compiler does not software-pipeline, so the compiled kernels keep `for`.
WHILE_LOOPS = interpreted()


_TABLE_BUILDER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-tables")
_on_builder = threading.local()


def build_on_table_thread(build, args, stream=None):
    """`build(*args)` run on the table builder's thread, in `stream` (a CUDA stream, or
    None), the caller waiting for it; a table that `build` asks for from another
    `shape_cache` is built in place on that thread."""

    def run():
        _on_builder.active = True
        try:
            if stream is None:
                return build(*args)
            with torch.cuda.device(stream.device), torch.cuda.stream(stream):
                return build(*args)
        finally:
            _on_builder.active = False

    return _TABLE_BUILDER.submit(run).result()


_PINNED: dict = {}  # (build, args) -> a table a CUDA graph was captured reading: never freed


def _capturing(device) -> bool:
    return device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _device_of(args) -> torch.device | None:
    """The `torch.device` among a table's arguments (None: a table without one)."""
    return next((a for a in args if isinstance(a, torch.device)), None)


def shape_cache(maxsize: int):
    """functools.lru_cache for the index tables the kernels build once per shape, whose
    arguments include the `torch.device` the tables live on.

    A cached CUDA tensor outlives the call that made it, so it must not come from a CUDA
    graph's private memory pool: torch.compile's CUDA graph trees route every allocation
    of the thread that warms up or records a graph into that pool, which later replays
    overwrite (and whose warm-up refuses tensors it does not track as outputs). So a CUDA
    miss builds its value with `build_on_table_thread`, whose allocations stay in the
    default pool, in the caller's current stream (the work is ordered as if built in
    place). A miss while a CUDA graph is being captured raises: the tables of every shape
    are built when the graph is warmed up, which always comes first. A table looked up
    while a graph is captured is also kept outside the LRU (the graph reads it at its
    address without holding a reference), so evicting it frees nothing a graph reads;
    the others are evicted as usual (packed sequences of ever new lengths, each its own
    key, would otherwise hold GPU memory without bound)."""

    def decorate(build):
        @functools.lru_cache(maxsize)
        def cached(*args):
            device = _device_of(args)
            if getattr(_on_builder, "active", False) or device is None or device.type != "cuda":
                return build(*args)  # on the builder's thread already (a table built from another), or no CUDA
            if _capturing(device):
                raise RuntimeError(f"{build.__name__}{args}: a table first needed while a CUDA graph is captured; "
                                   "run the graph's shapes once before capturing it")
            index = torch.cuda.current_device() if device.index is None else device.index
            return build_on_table_thread(build, args, torch.cuda.current_stream(index))

        @functools.wraps(build)
        def lookup(*args):
            value = cached(*args)
            if _capturing(_device_of(args)):
                _PINNED[build, args] = value
            return value

        lookup.cache_clear, lookup.cache_info = cached.cache_clear, cached.cache_info
        return lookup

    return decorate
