"""`gsa_attn`: the whole-sequence GSA op, checked and dispatched to a backend.

"triton" runs the Triton kernels (`chunk.chunk_gsa_attn`, imported on first use),
"torch" the chunked PyTorch path (`torch_path`). When the backend was "auto" and the
Triton side is missing or does not implement a case (NotImplementedError), the PyTorch
path runs instead, with a warning; an explicit backend="triton" never falls back.
"""

from ..backend import resolve_backend, run_triton
from .checks import check_gsa_args, check_scale
from .torch_path import torch_gsa_attn


def gsa_attn(q, k, v, log_alpha, *, causal=True, cross=False, scale=None, initial_state=None,
             output_final_state=False, kv_mask=None, cu_seqlens=None, backend="auto"):
    """Gated slot attention over whole sequences, any of the patterns CS NS CC NC.

    q [B,T,H,dk]; k [B,S,H,dk]; v [B,S,H,dv]; log_alpha [B,S,H,M] (<= 0, not checked:
    that would cost a device sync; the write weight is s = 1 - exp(log_alpha)); kv_mask [B,S] bool, True = real position (in
    self-attention it also zeroes the padded queries' outputs); cu_seqlens [N+1] packs N
    self-attention sequences in batch 1 (FlashAttention convention), each run alone.
    initial_state (K~ [B,H,M,dk], V~ [B,H,M,dv], B = N with cu_seqlens) seeds the
    left-to-right scan. An empty source (S = 0) needs no kernel and runs on the PyTorch
    path: the final state is the initial one, and cross-attention queries read it.
    Returns (o [B,T,H,dv] in q's dtype, the final GsaState in fp32 (fp64 for fp64 inputs)
    or None).
    """
    check_gsa_args(q, k, v, log_alpha, cross, initial_state, kv_mask, cu_seqlens)
    check_scale(scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kwargs = dict(causal=causal, cross=cross, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, kv_mask=kv_mask, cu_seqlens=cu_seqlens)
    run_torch = lambda: torch_gsa_attn(q, k, v, log_alpha, **kwargs)  # noqa: E731
    if resolve_backend(backend, q) == "triton" and k.shape[1] > 0:
        def run_kernels():
            from .chunk import chunk_gsa_attn

            return chunk_gsa_attn(q, k, v, log_alpha, **kwargs)

        return run_triton(backend, "gsa_attn", run_kernels, run_torch)
    return run_torch()
