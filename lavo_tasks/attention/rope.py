"""Rotary position embedding (RoPE) for self-attention in the `softmax`, `local`, `lavo` blocks.

The models have no absolute position embedding; rotating queries and keys by angles
proportional to their positions makes the score of a (query, key) pair depend on the
distance between them only, so a model trained at one length runs at longer ones.
"""

import torch

from ..kernels.backend import resolve_backend, run_triton
from ..kernels.common import KERNEL_DTYPES, shape_cache

BASE = 10000.0


def inv_freq(half: int, device: torch.device) -> torch.Tensor:
    """[half] fp32: BASE ** (-i / half), channel pair i's angle per position."""
    return BASE ** (-torch.arange(half, device=device, dtype=torch.float32) / max(half, 1))


inv_freq_table = shape_cache(maxsize=16)(inv_freq)  # the kernel's, built once per head dim and device


def apply_rope(x: torch.Tensor, offset: int | torch.Tensor = 0, backend: str = "auto") -> torch.Tensor:
    """Rotate x [B, T, H, d] as if its positions were offset, offset+1, ..., offset+T-1.
    `offset` is an int or a 0-dim long tensor on x's device (a captured decode step reads
    its position from the device).

    Channel i is paired with channel i + d//2 (the "half split" layout) and the pair is
    rotated by position * BASE ** (-i / (d//2)). With an odd head dim the last channel
    is left as it is. Angles and the rotation are computed in fp32; the result has x's
    dtype.

    Eager calls on CUDA with an int offset run the fused kernel (kernels/rope.py: one
    launch forward and one backward, where these PyTorch ops launch about thirty) unless
    `backend` (the block's, as the ops take it; LAVO_TASKS_BACKEND for "auto") says
    torch; torch.compile traces the ops below, which it fuses itself.
    """
    if (x.is_cuda and isinstance(offset, int) and x.dtype in KERNEL_DTYPES and not torch.compiler.is_compiling()
            and resolve_backend(backend, x) == "triton"):

        def kernel():
            from ..kernels.rope import rope_op

            return rope_op(x, offset, inv_freq_table(x.shape[-1] // 2, x.device))

        return run_triton(backend, "apply_rope", kernel, lambda: rope_reference(x, offset))
    return rope_reference(x, offset)


def rope_reference(x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
    """`apply_rope` in PyTorch ops."""
    T, d = x.shape[1], x.shape[-1]
    half = d // 2
    positions = offset + torch.arange(T, device=x.device, dtype=torch.float32)
    angles = positions[:, None] * inv_freq(half, x.device)[None, :]  # [T, half]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # [T, 1, half]: broadcast over B and H
    xf = x.float()
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)
    return rotated.to(x.dtype)
