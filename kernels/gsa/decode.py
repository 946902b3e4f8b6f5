"""`gsa_decode_step`: one GSA decode step on a constant-size state, checked and
dispatched to a backend ("triton": `recurrent.recurrent_gsa_step`, imported on first
use; "torch": `torch_path.torch_gsa_step`; the same fallback rule as `gsa_attn`). The
state is in `state.py`.
"""

from ..backend import resolve_backend, run_triton
from .checks import check_gsa_step_args
from .torch_path import torch_gsa_step


def gsa_decode_step(q, k, v, log_alpha, state, *, scale=None, backend="auto"):
    """One decode step: write (k, v, log_alpha) into the state, then read it with q.

    q [B,H,dk]; k [B,H,dk]; v [B,H,dv]; log_alpha [B,H,M]; state a `GsaState` (K~
    [B,H,M,dk], V~ [B,H,M,dv]; a plain pair serves too) in fp32. Returns (o [B,H,dv] in
    q's dtype, the new GsaState in fp32; fp64 for fp64 inputs on the PyTorch path).
    """
    check_gsa_step_args(q, k, v, log_alpha, state, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    run_torch = lambda: torch_gsa_step(q, k, v, log_alpha, state, scale=scale)  # noqa: E731
    if resolve_backend(backend, q) == "triton":
        def run_kernel():
            from .recurrent import recurrent_gsa_step

            return recurrent_gsa_step(q, k, v, log_alpha, state, scale=scale)

        return run_triton(backend, "gsa_decode_step", run_kernel, run_torch)
    return run_torch()
