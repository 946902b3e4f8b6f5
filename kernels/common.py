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


def tile_width(n: int) -> int:
    """The width of a Triton tile that holds n >= 1 columns: the smallest power of 2 that
    is >= n, and at least MIN_DOT."""
    return max(MIN_DOT, next_pow2(n))


def interpreted() -> bool:
    """Whether Triton runs its kernels in the interpreter (TRITON_INTERPRET=1, read when
    triton.jit decorates a kernel: the kernel modules ask once, at their import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_TABLE_BUILDER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-tables")
_on_builder = threading.local()


def shape_cache(maxsize: int):
    """functools.lru_cache for the index tables the kernels build once per shape, whose
    arguments include the `torch.device` the tables live on.

    A cached tensor outlives the call that made it, so it must not come from a CUDA graph's
    private memory pool: torch.compile's CUDA graph trees route every allocation of the
    thread that warms up or records a graph into that pool, which later replays overwrite
    (and whose warm-up refuses tensors it does not track as outputs). So a miss builds
    its value on a thread of its own, whose allocations stay in the default pool, in the
    caller's current stream (the caller waits for it: the work is ordered as if built
    in place). A miss while a CUDA graph is being captured raises: the tables of every
    shape are built when the graph is warmed up, which always comes first."""

    def decorate(build):
        def on_builder(device, stream, args):
            _on_builder.active = True
            try:
                if stream is None:
                    return build(*args)
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    return build(*args)
            finally:
                _on_builder.active = False

        @functools.lru_cache(maxsize)
        @functools.wraps(build)
        def cached(*args):
            if getattr(_on_builder, "active", False):  # a table built from another one
                return build(*args)
            device = next((a for a in args if isinstance(a, torch.device)), None)
            stream = None
            if device is not None and device.type == "cuda":
                if torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(f"{build.__name__}{args}: a table first needed while a CUDA graph is captured; "
                                       "run the graph's shapes once before capturing it")
                device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
                stream = torch.cuda.current_stream(device)
            return _TABLE_BUILDER.submit(on_builder, device, stream, args).result()

        return cached

    return decorate
