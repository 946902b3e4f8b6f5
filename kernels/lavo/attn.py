"""`lavo_attn`: the whole-sequence LAVO op, checked and dispatched to a backend."""

from ..backend import resolve_backend, run_triton
from .checks import check_lavo_args
from .torch_path import torch_lavo_attn


def lavo_attn(
    q, k, v, basis, rel_bias, mem_bias, *, window, causal=True, cross=False, segments=1, scale=None, kv_mask=None,
    cu_seqlens=None, backend="auto",
):
    """LAVO attention: a local window and an orthogonal memory under one softmax.

    q [B, T, H, d]; k, v [B, S, H, d] (S = T for self-attention); basis [H, r, d] with
    orthonormal rows (1 <= r <= d); rel_bias [H, window] (causal) or [H, window + 1]
    (noncausal; may be None for NC, which has no window); mem_bias [H] or [H, segments];
    segments > 1 only for NC; scale defaults to d ** -0.5; kv_mask [B, S] bool, True = a
    real position (in self-attention it also zeroes padded queries' outputs); cu_seqlens:
    offsets of sequences packed along time (self-attention, B = 1). Returns o [B, T, H, d]
    in q's dtype. Raises ValueError for a bad argument.

    backend: "auto" (Triton on CUDA tensors, PyTorch otherwise, and for what the kernels
    do not cover: float64, head dim > 256), "triton" or "torch".
    """
    check_lavo_args(
        q, k, v, basis, rel_bias, mem_bias, window=window, causal=causal, cross=cross, segments=segments,
        scale=scale, kv_mask=kv_mask, cu_seqlens=cu_seqlens,
    )
    options = dict(
        window=window, causal=causal, cross=cross, segments=segments, scale=scale, kv_mask=kv_mask, cu_seqlens=cu_seqlens
    )
    run_torch = lambda: torch_lavo_attn(q, k, v, basis, rel_bias, mem_bias, **options)  # noqa: E731
    if resolve_backend(backend, q) == "triton":
        def run_kernels():
            from .chunk import chunk_lavo_attn

            return chunk_lavo_attn(q, k, v, basis, rel_bias, mem_bias, **options)

        return run_triton(backend, "lavo_attn", run_kernels, run_torch)
    return run_torch()
