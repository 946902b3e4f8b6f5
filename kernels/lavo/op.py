"""The LAVO Triton passes as PyTorch custom operators, so `torch.compile` treats them as
single nodes (no graph break: Dynamo never looks inside the launches and host-side chunk
tables) and CUDA graphs can capture them.

`lavo_tasks::lavo_chunk_fwd` returns (o, lse, pre, cnt, segid, tiles, bas): the output,
the log-sum-exp and the tables the backward reads (chunk.Saved: an operator returns tensors
only, so they travel as outputs, not differentiable, saved by the autograd context);
`lavo_tasks::lavo_chunk_bwd` the gradients of the forward's inputs. Each has a
fake-tensor implementation (the output shapes from the input shapes alone), and the
forward's autograd runs the backward op. Both run whatever device the inputs are on: the
kernels on CUDA, or Triton's interpreter on the CPU (the tests). Eager calls run the
same two passes under a plain autograd.Function instead (`lavo_chunk_op`), which costs
less host time than the operators' dispatch. The PyTorch path is plain tensor ops and
needs no operator.
"""

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .chunk import Saved, lavo_chunk_backward, lavo_chunk_forward, saved_shapes


@torch.library.custom_op("lavo_tasks::lavo_chunk_fwd", mutates_args=())
def lavo_chunk_fwd(q: Tensor, k: Tensor, v: Tensor, basis: Tensor, rel_bias: Tensor | None, mem_bias: Tensor,
                   kv_mask: Tensor | None, cu_seqlens: Tensor | None, window: int, causal: bool, cross: bool,
                   segments: int, scale: float,
                   chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (o [B, T, H, d] in q's dtype, lse [B*T, H] fp32, pre, cnt, segid, tiles, bas)."""
    o, lse, saved = lavo_chunk_forward(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross,
                                       segments, scale, chunk)
    return o, lse, *saved


@lavo_chunk_fwd.register_fake
def _(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, scale, chunk):
    batch, n, heads, _ = q.shape
    shapes = saved_shapes(q, k, basis, kv_mask, cu_seqlens, window, causal, cross, segments, chunk)
    saved = (q.new_empty(shape, dtype=dtype) for shape, dtype in shapes)
    return _new(q), q.new_empty(batch * n, heads, dtype=torch.float32), *saved


@torch.library.custom_op("lavo_tasks::lavo_chunk_bwd", mutates_args=())
def lavo_chunk_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, pre: Tensor, cnt: Tensor,
                   segid: Tensor, tiles: Tensor, bas: Tensor, basis: Tensor, rel_bias: Tensor | None, mem_bias: Tensor,
                   kv_mask: Tensor | None, cu_seqlens: Tensor | None, window: int, causal: bool, cross: bool,
                   segments: int, scale: float,
                   chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (dq, dk, dv, dbasis, drel_bias, dmem_bias); drel_bias is empty [0] when rel_bias
    is None (an operator returns tensors only). Every one is new and contiguous."""
    dq, dk, dv, dbasis, drel, dmu = lavo_chunk_backward(
        do, q, k, v, o, lse, Saved(pre, cnt, segid, tiles, bas), basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window,
        causal, cross, segments, scale, chunk,
    )
    return dq, dk, dv, dbasis, (drel if drel is not None else q.new_empty(0)), dmu


@lavo_chunk_bwd.register_fake
def _(do, q, k, v, o, lse, pre, cnt, segid, tiles, bas, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal,
      cross, segments, scale, chunk):
    drel = _new(rel_bias) if rel_bias is not None else q.new_empty(0)
    return (_new(q), _new(k), _new(v), _new(basis), drel,
            _new(mem_bias))


def _new(x):
    """An empty tensor like x, contiguous whatever x's strides: the ops' outputs always are,
    and Inductor checks a fake's strides against the real output's."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_context(ctx, inputs, output):
    q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, *options = inputs
    ctx.save_for_backward(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, *output)
    ctx.options = options  # window, causal, cross, segments, scale, chunk
    ctx.mark_non_differentiable(*output[1:])  # lse and the tables: no gradient flows into them
    ctx.set_materialize_grads(False)  # so their gradients reach _backward as None, not zeros


_NO_GRADS = (None,) * 8  # kv_mask, cu_seqlens and the six options


def _backward(ctx, do, *_):
    q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, o, lse, *saved = ctx.saved_tensors
    dq, dk, dv, dbasis, drel, dmu = lavo_chunk_bwd(do, q, k, v, o, lse, *saved, basis, rel_bias, mem_bias, kv_mask,
                                                   cu_seqlens, *ctx.options)
    return dq, dk, dv, dbasis, (drel if rel_bias is not None else None), dmu, *_NO_GRADS


torch.library.register_autograd("lavo_tasks::lavo_chunk_fwd", _backward, setup_context=_setup_context)


class _EagerChunk(torch.autograd.Function):
    """The forward and backward ops' bodies under one autograd.Function, for calls that
    are not being compiled: the same passes and saved tensors as the operators'
    registered autograd, without the custom-operator machinery around them (two
    dispatcher round trips per pass and torch's `fill_defaults` over the forward's
    schema, ~0.2 ms of host time per forward+backward on a CPU, over a third of what
    remains: benchmarks/lavo_host_cost.py)."""

    @staticmethod
    def forward(ctx, q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, *options):
        o, lse, saved = lavo_chunk_forward(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, *options)
        ctx.save_for_backward(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, o, lse, *saved)
        ctx.options = options  # window, causal, cross, segments, scale, chunk
        return o

    @staticmethod
    @once_differentiable  # the backward kernels have no backward of their own
    def backward(ctx, do):
        q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, o, lse, *saved = ctx.saved_tensors
        grads = lavo_chunk_backward(do, q, k, v, o, lse, Saved(*saved), basis, rel_bias, mem_bias, kv_mask, cu_seqlens,
                                    *ctx.options)
        return *grads, *_NO_GRADS


def lavo_chunk_op(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, scale,
                  chunk):
    """o [B, T, H, d] of the forward pass, differentiable through the backward pass: the
    custom operators while torch.compile traces (one graph node each, no graph break),
    `_EagerChunk` otherwise."""
    args = (q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, scale, chunk)
    if torch.compiler.is_compiling():
        return lavo_chunk_fwd(*args)[0]
    return _EagerChunk.apply(*args)
