"""What the LAVO and GSA folders share: the dtype rules, the smallest tile of Triton's
products, and whether Triton runs in its interpreter.

Only facts that hold for both ops live here. An op's own tile sizes, chunk lengths and
launch settings stay in its folder (`lavo/chunk.py`, `gsa/chunk.py`, ...): they are tuned
per op, and the tests and `benchmarks/` scripts patch them there (docs/design.md §1).
This module imports torch only, so the PyTorch paths use it without Triton installed.
"""

import os

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
