"""The GSA Triton passes as PyTorch custom operators, so `torch.compile` treats them as
single nodes (no graph break: Dynamo never looks inside the launches and host-side chunk
tables) and CUDA graphs can capture them.

`lavo_tasks::gsa_causal_fwd` is the causal scan over packed sequences that every pattern
runs (chunk.py's `causal_forward`); `lavo_tasks::gsa_causal_bwd` its backward; the
forward's autograd runs the backward op. `lavo_tasks::silu_rms_norm_fwd` / `_bwd` are the
layer's fused output norm (output_norm.py). Each op has a fake-tensor implementation,
the output shapes from the input shapes and the sequence lengths (Python ints) alone.
Eager calls run the same passes under plain autograd.Functions instead (`gsa_causal_op`,
`silu_rms_norm_op`), as LAVO's do: the operators' dispatch and registered autograd cost
host time that an eager step, bound by its host, pays at every layer.
"""

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunk import causal_backward, causal_forward, chunk_count
from .output_norm import silu_rms_norm_backward, silu_rms_norm_forward

_F32 = torch.float32


@torch.library.custom_op("lavo_tasks::gsa_causal_fwd", mutates_args=())
def gsa_causal_fwd(q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, h0k: Tensor | None, h0v: Tensor | None,
                   scale: float, lengths: list[int],
                   output_final_state: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (o, K~_T, V~_T, b, z, gsum, sk, sv): chunk.causal_forward's outputs (q None: the
    states only, o and z empty)."""
    return tuple(t.contiguous() for t in causal_forward(q, k, v, g, h0k, h0v, scale, lengths, output_final_state))


@gsa_causal_fwd.register_fake
def _(q, k, v, g, h0k, h0v, scale, lengths, output_final_state):
    (n_tok, heads, dk), dv, slots = k.shape, v.shape[-1], g.shape[-1]
    n_chunks = chunk_count(lengths)
    if output_final_state:
        hk, hv = (k.new_empty(len(lengths), heads, slots, d, dtype=_F32) for d in (dk, dv))
    else:
        hk, hv = k.new_empty(0, dtype=_F32), k.new_empty(0, dtype=_F32)
    o, z = (q.new_empty(n_tok, heads, dv), _new(g)) if q is not None else (k.new_empty(0), k.new_empty(0, dtype=_F32))
    return (o, hk, hv, _new(g), z,
            k.new_empty(n_chunks, heads, slots, dtype=_F32), k.new_empty(n_chunks, heads, slots, dk, dtype=_F32),
            k.new_empty(n_chunks, heads, slots, dv, dtype=_F32))


@torch.library.custom_op("lavo_tasks::gsa_causal_bwd", mutates_args=())
def gsa_causal_bwd(do: Tensor | None, dhk: Tensor | None, dhv: Tensor | None, q: Tensor | None, k: Tensor, v: Tensor,
                   g: Tensor, b: Tensor, z: Tensor, gsum: Tensor, sk: Tensor, sv: Tensor, hk: Tensor, hv: Tensor,
                   scale: float, lengths: list[int],
                   has_h0: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (dq, dk, dv, dg, dh0k, dh0v); dh0k, dh0v are empty [0] without h0 and dq without q
    (an operator returns tensors only); do is None without q."""
    dq, dk, dv, dg, dh0k, dh0v = causal_backward(do, dhk, dhv, q, k, v, g, b, z, gsum, sk, sv, hk, hv, scale,
                                                 lengths, has_h0)
    if not has_h0:
        dh0k, dh0v = k.new_empty(0, dtype=_F32), k.new_empty(0, dtype=_F32)
    if q is None:
        dq = k.new_empty(0)
    return tuple(t.contiguous() for t in (dq, dk, dv, dg, dh0k, dh0v))


@gsa_causal_bwd.register_fake
def _(do, dhk, dhv, q, k, v, g, b, z, gsum, sk, sv, hk, hv, scale, lengths, has_h0):
    (heads, dk), dv, slots = k.shape[1:], v.shape[-1], g.shape[-1]
    if has_h0:
        dh0k, dh0v = (k.new_empty(len(lengths), heads, slots, d, dtype=_F32) for d in (dk, dv))
    else:
        dh0k, dh0v = k.new_empty(0, dtype=_F32), k.new_empty(0, dtype=_F32)
    return _new(q) if q is not None else k.new_empty(0), _new(k), _new(v), _new(g), dh0k, dh0v


def _new(x):
    """An empty tensor like x, contiguous whatever x's strides: the ops' outputs always are,
    and Inductor checks a fake's strides against the real output's."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _causal_setup(ctx, inputs, output):
    q, k, v, g, h0k, _h0v, scale, lengths, output_final_state = inputs
    _o, hk, hv, b, z, gsum, sk, sv = output
    ctx.save_for_backward(q, k, v, g, b, z, gsum, sk, sv, hk, hv)
    ctx.scale, ctx.lengths, ctx.has_h0, ctx.output_final_state = scale, lengths, h0k is not None, output_final_state


def _causal_grads(ctx, do, dhk, dhv, backward):
    """The gradients of the scan's inputs (None for the options) through `backward`, the
    backward op or chunk.causal_backward itself: the final state's gradients count only
    where it was returned, and the query side runs only where an output was read (q
    given and its gradient not None)."""
    q, k, v, g, b, z, gsum, sk, sv, hk, hv = ctx.saved_tensors
    if not ctx.output_final_state:
        dhk = dhv = None
    read = q is not None and do is not None
    dq, dk, dv, dg, dh0k, dh0v = backward(do if read else None, dhk, dhv, q if read else None, k, v, g, b, z, gsum,
                                          sk, sv, hk, hv, ctx.scale, ctx.lengths, ctx.has_h0)
    if not ctx.has_h0:
        dh0k = dh0v = None
    return (dq if read else None), dk, dv, dg, dh0k, dh0v, None, None, None


def _causal_backward(ctx, do, dhk, dhv, *_unused):
    return _causal_grads(ctx, do, dhk, dhv, gsa_causal_bwd)


torch.library.register_autograd("lavo_tasks::gsa_causal_fwd", _causal_backward, setup_context=_causal_setup)


class _EagerCausal(torch.autograd.Function):
    """The scan's forward and backward passes under one autograd.Function, for calls that
    are not being compiled: the operators' passes and saved tensors without their
    dispatch."""

    @staticmethod
    def forward(ctx, *inputs):  # the forward op's arguments
        output = causal_forward(*inputs)
        _causal_setup(ctx, inputs, output)
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return output[:3]  # o, K~_T, V~_T

    @staticmethod
    @once_differentiable  # the backward kernels have no backward of their own
    def backward(ctx, do, dhk, dhv):
        return _causal_grads(ctx, do, dhk, dhv, causal_backward)


def gsa_causal_op(q, k, v, g, h0k, h0v, scale, lengths, output_final_state):
    """(o [N,H,dv], K~_T, V~_T or None, None) of the forward pass, differentiable through
    the backward pass: the custom operators while torch.compile traces, `_EagerCausal`
    otherwise; q None: the states only (o empty)."""
    if torch.compiler.is_compiling():
        o, hk, hv, *_ = gsa_causal_fwd(q, k, v, g, h0k, h0v, scale, lengths, output_final_state)
    else:
        o, hk, hv = _EagerCausal.apply(q, k, v, g, h0k, h0v, scale, lengths, output_final_state)
    return (o, hk, hv) if output_final_state else (o, None, None)


@torch.library.custom_op("lavo_tasks::silu_rms_norm_fwd", mutates_args=())
def silu_rms_norm_fwd(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x [..., d] -> (y like x, rstd [rows] fp32, the per-row 1/rms the backward reads)."""
    return tuple(t.contiguous() for t in silu_rms_norm_forward(x, weight, eps))


@silu_rms_norm_fwd.register_fake
def _(x, weight, eps):
    return _new(x), x.new_empty(x.numel() // x.shape[-1], dtype=_F32)


@torch.library.custom_op("lavo_tasks::silu_rms_norm_bwd", mutates_args=())
def silu_rms_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """-> (dx like x, dweight like weight)."""
    return tuple(t.contiguous() for t in silu_rms_norm_backward(dy, x, weight, rstd))


@silu_rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return _new(x), _new(weight)


def _norm_setup(ctx, inputs, output):
    x, weight, _eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = silu_rms_norm_bwd(dy, x, weight, rstd)
    return dx, dweight, None


torch.library.register_autograd("lavo_tasks::silu_rms_norm_fwd", _norm_backward, setup_context=_norm_setup)


class _EagerNorm(torch.autograd.Function):
    """The output norm's kernels under one autograd.Function, for calls that are not being
    compiled."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        output = silu_rms_norm_forward(x, weight, eps)
        _norm_setup(ctx, (x, weight, eps), output)
        return output[0]

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return *silu_rms_norm_backward(dy, *ctx.saved_tensors), None


def silu_rms_norm_op(x, weight, eps):
    """RMSNorm(SiLU(x)) * weight on the kernels, differentiable: the custom operators while
    torch.compile traces, `_EagerNorm` otherwise."""
    if torch.compiler.is_compiling():
        return silu_rms_norm_fwd(x, weight, eps)[0]
    return _EagerNorm.apply(x, weight, eps)
