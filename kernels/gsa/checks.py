"""Argument checks of the GSA ops (`gsa_attn`, `gsa_decode_step`).

The dispatchers run them once before any backend, so the implementations behind them
(PyTorch path, Triton kernels, reference) may assume well-formed inputs. Each message
names the argument and what is allowed. log_alpha <= 0 is not checked: that would cost
a device sync.
"""

import torch


def check_tensor(name, x, ndim, layout):
    if not isinstance(x, torch.Tensor) or x.dim() != ndim or not x.is_floating_point():
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"gsa: {name} must be a floating-point tensor {layout}; got {got}")


def check_state(name, state, batch, heads, slots, dk, dv, device):
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise ValueError(f"gsa: {name} must be a GsaState or a pair (K~ [B,H,M,dk], V~ [B,H,M,dv]); "
                         f"got {type(state).__name__}")
    for part, x, d in (("K~", state[0], dk), ("V~", state[1], dv)):
        want = (batch, heads, slots, d)
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or not x.is_floating_point():
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"gsa: {name} {part} must be a floating-point tensor of shape {want}; got {got}")
        if x.device != device:
            raise ValueError(f"gsa: {name} {part} is on {x.device}, the inputs on {device}")


def check_scale(scale):
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"gsa: scale={scale!r}: must be a positive number or None (head dim ** -0.5)")


def check_gsa_args(q, k, v, log_alpha, cross, initial_state, kv_mask, cu_seqlens):
    """Raise ValueError naming the argument for any shape/type the math does not define."""
    check_tensor("q", q, 4, "[B,T,H,dk]")
    check_tensor("k", k, 4, "[B,S,H,dk]")
    check_tensor("v", v, 4, "[B,S,H,dv]")
    check_tensor("log_alpha", log_alpha, 4, "[B,S,H,M]")
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
        check_state("initial_state", initial_state, n_states, heads, slots, dk, dv, q.device)


def check_gsa_step_args(q, k, v, log_alpha, state, scale):
    """The arguments of `gsa_decode_step` (one token per row)."""
    check_tensor("q", q, 3, "[B,H,dk]")
    check_tensor("k", k, 3, "[B,H,dk]")
    check_tensor("v", v, 3, "[B,H,dv]")
    check_tensor("log_alpha", log_alpha, 3, "[B,H,M]")
    (batch, heads, dk), dv, slots = q.shape, v.shape[-1], log_alpha.shape[-1]
    if k.shape != q.shape or v.shape[:2] != (batch, heads) or log_alpha.shape[:2] != (batch, heads):
        raise ValueError(f"gsa_decode_step: inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, log_alpha {tuple(log_alpha.shape)}")
    if any(x.device != q.device for x in (k, v, log_alpha)):
        raise ValueError("gsa_decode_step: q, k, v, log_alpha must be on one device")
    check_state("state", state, batch, heads, slots, dk, dv, q.device)
    check_scale(scale)
