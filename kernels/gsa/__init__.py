"""GSA (gated slot attention) as functions: the whole sequence (`gsa_attn`) and one
decode step (`gsa_decode_step`). Math and API: docs/design.md §2.3 and §2.6.

Both validate their arguments, then dispatch: "triton" to the Triton kernels
(`chunk.chunk_gsa_attn`, `recurrent.recurrent_gsa_step`, imported on first use), "torch"
to the chunked PyTorch path (`torch_path`). When the backend was "auto" and the Triton
side is missing or does not implement a case (NotImplementedError), the PyTorch path
runs instead, with a warning; an explicit backend="triton" never falls back.
"""


import torch

from ..backend import resolve_backend, run_triton
from .torch_path import torch_gsa_attn, torch_gsa_step


def _check_tensor(name, x, ndim, layout):
    if not isinstance(x, torch.Tensor) or x.dim() != ndim or not x.is_floating_point():
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"gsa: {name} must be a floating-point tensor {layout}; got {got}")


def _check_state(name, state, batch, heads, slots, dk, dv, device):
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise ValueError(f"gsa: {name} must be a pair (K~ [B,H,M,dk], V~ [B,H,M,dv]); got {type(state).__name__}")
    for part, x, d in (("K~", state[0], dk), ("V~", state[1], dv)):
        want = (batch, heads, slots, d)
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or not x.is_floating_point():
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"gsa: {name} {part} must be a floating-point tensor of shape {want}; got {got}")
        if x.device != device:
            raise ValueError(f"gsa: {name} {part} is on {x.device}, the inputs on {device}")


def _check_scale(scale):
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"gsa: scale={scale!r}: must be a positive number or None (head dim ** -0.5)")


def _check_attn_args(q, k, v, log_alpha, cross, initial_state, kv_mask, cu_seqlens):
    """Raise ValueError naming the argument for any shape/type the math does not define."""
    _check_tensor("q", q, 4, "[B,T,H,dk]")
    _check_tensor("k", k, 4, "[B,S,H,dk]")
    _check_tensor("v", v, 4, "[B,S,H,dv]")
    _check_tensor("log_alpha", log_alpha, 4, "[B,S,H,M]")
    (batch, n, heads, dk), m, dv, slots = q.shape, k.shape[1], v.shape[-1], log_alpha.shape[-1]
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, log_alpha {tuple(log_alpha.shape)}"
    if k.shape != (batch, m, heads, dk) or v.shape[:3] != (batch, m, heads) or log_alpha.shape[:3] != (batch, m, heads):
        raise ValueError(f"gsa: inconsistent shapes {shapes}: need q [B,T,H,dk], k [B,S,H,dk], v [B,S,H,dv], "
                         "log_alpha [B,S,H,M]")
    if min(dk, dv, slots, heads) < 1:
        raise ValueError(f"gsa: empty head, head dim or slot dimension in {shapes}")
    if not cross and n != m:
        raise ValueError(f"gsa: self-attention (cross=False) needs q and k of the same length; {shapes}")
    if any(x.device != q.device for x in (k, v, log_alpha)):
        raise ValueError("gsa: q, k, v, log_alpha must be on one device")
    if kv_mask is not None:
        if not isinstance(kv_mask, torch.Tensor) or kv_mask.dtype != torch.bool or tuple(kv_mask.shape) != (batch, m):
            got = (kv_mask.dtype, tuple(kv_mask.shape)) if isinstance(kv_mask, torch.Tensor) else type(kv_mask).__name__
            raise ValueError(f"gsa: kv_mask must be a bool tensor [B,S] = {(batch, m)}; got {got}")
        if kv_mask.device != q.device:
            raise ValueError(f"gsa: kv_mask is on {kv_mask.device}, the inputs on {q.device}")
    n_states = batch
    if cu_seqlens is not None:
        if cross:
            raise ValueError("gsa: cu_seqlens packs self-attention sequences; it is not defined with cross=True")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() \
                or cu_seqlens.numel() < 2:
            raise ValueError("gsa: cu_seqlens must be a 1-D integer tensor [N+1] of sequence boundaries")
        if batch != 1:
            raise ValueError(f"gsa: with cu_seqlens the sequences are packed in batch 1; got batch {batch}")
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != n or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"gsa: cu_seqlens={cu}: must rise from 0 to the packed length {n}")
        n_states = len(cu) - 1
    if initial_state is not None:
        _check_state("initial_state", initial_state, n_states, heads, slots, dk, dv, q.device)


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
    Returns (o [B,T,H,dv] in q's dtype, final state in fp32 (fp64 for fp64 inputs) or None).
    """
    _check_attn_args(q, k, v, log_alpha, cross, initial_state, kv_mask, cu_seqlens)
    _check_scale(scale)
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


def gsa_decode_step(q, k, v, log_alpha, state, *, scale=None, backend="auto"):
    """One decode step: write (k, v, log_alpha) into the state, then read it with q.

    q [B,H,dk]; k [B,H,dk]; v [B,H,dv]; log_alpha [B,H,M]; state (K~ [B,H,M,dk],
    V~ [B,H,M,dv]) in fp32. Returns (o [B,H,dv] in q's dtype, new state in fp32; fp64 for
    fp64 inputs on the PyTorch path).
    """
    _check_tensor("q", q, 3, "[B,H,dk]")
    _check_tensor("k", k, 3, "[B,H,dk]")
    _check_tensor("v", v, 3, "[B,H,dv]")
    _check_tensor("log_alpha", log_alpha, 3, "[B,H,M]")
    (batch, heads, dk), dv, slots = q.shape, v.shape[-1], log_alpha.shape[-1]
    if k.shape != q.shape or v.shape[:2] != (batch, heads) or log_alpha.shape[:2] != (batch, heads):
        raise ValueError(f"gsa_decode_step: inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, log_alpha {tuple(log_alpha.shape)}")
    if any(x.device != q.device for x in (k, v, log_alpha)):
        raise ValueError("gsa_decode_step: q, k, v, log_alpha must be on one device")
    _check_state("state", state, batch, heads, slots, dk, dv, q.device)
    _check_scale(scale)
    scale = dk ** -0.5 if scale is None else float(scale)
    run_torch = lambda: torch_gsa_step(q, k, v, log_alpha, state, scale=scale)  # noqa: E731
    if resolve_backend(backend, q) == "triton":
        def run_kernel():
            from .recurrent import recurrent_gsa_step

            return recurrent_gsa_step(q, k, v, log_alpha, state, scale=scale)

        return run_triton(backend, "gsa_decode_step", run_kernel, run_torch)
    return run_torch()


__all__ = ["gsa_attn", "gsa_decode_step"]
