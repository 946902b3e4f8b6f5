"""`torch.compile(block, fullgraph=True)` of every attention block in every pattern it
supports, and `torch.library.opcheck` of the custom operators around the Triton passes
(kernels/lavo/op.py, kernels/gsa/op.py).

Every block and pattern compiles on the PyTorch path (plain tensor ops); `lavo` and `gsa`
also with backend="triton" (the kernels under Triton's interpreter, conftest.py), where
the compiled graph holds the custom operators. The compiled forward and backward (Dynamo and
AOTAutograd: "aot_eager" runs the graphs eagerly) must equal the eager ones: the outputs and the gradients of the input, the context and
every parameter. A graph break raises under fullgraph=True.
"""

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

from attention_cases import D_MODEL, make_block, padding_mask, supported
from lavo_tasks.kernels.gsa.op import gsa_causal_fwd, silu_rms_norm_fwd
from lavo_tasks.kernels.lavo.op import lavo_chunk_bwd, lavo_chunk_fwd

# The Triton path runs under the interpreter, seconds to minutes a case: one pattern per
# op family (LAVO CS: the window tables and the learned basis; GSA NS: both directions in
# one scan at this size, and the output norm), through aot_eager; the rest on the PyTorch
# path. Inductor on the CPU adds half a minute (GSA) to 3.5 minutes (LAVO) a case; what it checks on top of aot_eager,
# that the ops' outputs have the strides their fakes promise, is checked here by opcheck
# (below, the LAVO backward with a strided basis) and on the GPU by Inductor itself
# (tests/attention/test_gpu_compile.py).
ON_KERNELS = [pytest.param("lavo", "CS", "triton", "aot_eager", marks=pytest.mark.slow),
              pytest.param("gsa", "NS", "triton", "aot_eager", marks=pytest.mark.slow)]
CASES = [(name, pattern, "auto", "aot_eager") for name, pattern in supported({"CS", "NS", "CC", "NC"})] + ON_KERNELS


def run_block(block, x, context, mask, context_mask):
    """Forward + backward of one call -> [y, dx, dcontext or None, d every parameter]."""
    x = x.clone().requires_grad_()
    context = None if context is None else context.clone().requires_grad_()
    y, _ = block(x, context=context, mask=mask, context_mask=context_mask)
    y.backward(torch.linspace(-1, 1, y.numel()).view(y.shape))
    grads = [x.grad, None if context is None else context.grad] + [None if p.grad is None else p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    return [y.detach()] + grads


@pytest.mark.parametrize("name, pattern, backend, compiler", CASES)
def test_fullgraph_compile_equals_eager(name, pattern, backend, compiler):
    torch._dynamo.reset()
    block = make_block(name, pattern, **({"backend": backend} if name in ("lavo", "gsa") else {}))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 12, D_MODEL, generator=g)
    cross = pattern[1] == "C"
    context = torch.randn(3, 10, D_MODEL, generator=g) if cross else None
    mask, context_mask = padding_mask(12), (padding_mask(10) if cross else None)
    eager = run_block(block, x, context, mask, context_mask)
    compiled = run_block(torch.compile(block, fullgraph=True, backend=compiler), x, context, mask, context_mask)
    assert len(eager) == len(compiled) > 3
    nonzero = 0
    for i, (want, got) in enumerate(zip(eager, compiled)):
        if want is None or not want.any():  # no context (self-attention); NC's unused key projection
            assert got is None or not got.any(), i
            continue
        nonzero += 1
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"tensor {i}: {m}")
    assert nonzero >= len(eager) - 2, "the comparison would test next to nothing"


def _lavo_args(causal, cross, kv_mask, with_rel_bias=True, segments=1, packed=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(2)
    batch, n, m, heads, dim, rank, window = 2, 20, 18 if cross else 20, 2, 16, 4, 4
    if packed:  # three sequences along time, one of them empty
        batch, n, m = 1, 2 * n, 2 * n
    q = torch.randn(batch, n, heads, dim, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(batch, m, heads, dim, generator=g).to(dtype).requires_grad_() for _ in range(2))
    # [H, r, d] as the learned basis comes: a transposed view (strides [d*r, 1, r]); the fakes
    # must promise the real outputs' (contiguous) strides whatever the inputs' are
    basis = torch.linalg.qr(torch.randn(heads, dim, rank, generator=g))[0].contiguous().transpose(1, 2)
    assert not basis.is_contiguous()
    rel_bias = torch.randn(heads, window if causal else window + 1, generator=g) if with_rel_bias else None
    mem_bias = torch.randn(heads, generator=g)
    mask = padding_mask(m)[:batch] if kv_mask else None
    cu_seqlens = torch.tensor([0, 13, 13, n], dtype=torch.int32) if packed else None
    params = [x.requires_grad_() for x in (basis, rel_bias, mem_bias) if x is not None]
    assert params
    return (q, k, v, basis, rel_bias, mem_bias, mask, cu_seqlens, window, causal, cross, segments, dim**-0.5, 16)


# (the forward op's fake also gives the shapes of the tables it hands to the backward:
# made from a mask, per segment, for packed sequences, the basis cast to bf16 inputs)
@pytest.mark.parametrize("causal, cross, kv_mask, with_rel_bias, segments, packed, dtype", [
    (True, False, False, True, 1, False, torch.float32), (False, False, True, True, 1, False, torch.float32),
    (True, True, True, True, 1, False, torch.float32), (False, True, False, False, 1, False, torch.float32),
    (False, True, True, False, 3, False, torch.float32), (True, False, True, True, 1, True, torch.float32),
    (False, False, False, True, 1, True, torch.float32), (True, True, False, True, 1, False, torch.bfloat16),
])
def test_opcheck_lavo(causal, cross, kv_mask, with_rel_bias, segments, packed, dtype):
    torch.library.opcheck(lavo_chunk_fwd, _lavo_args(causal, cross, kv_mask, with_rel_bias, segments, packed, dtype),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("causal, cross, dtype", [(True, False, torch.float32), (False, True, torch.float32),
                                                  (True, True, torch.bfloat16)])
def test_opcheck_lavo_backward(causal, cross, dtype):
    q, k, v, basis, rel_bias, mem_bias, mask, cu, *options = _lavo_args(causal, cross, kv_mask=True, dtype=dtype)
    with torch.no_grad():
        o, lse, *saved = lavo_chunk_fwd(q, k, v, basis, rel_bias, mem_bias, mask, cu, *options)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    args = (do, q, k, v, o, lse, *saved, basis, rel_bias, mem_bias, mask, cu, *options)
    args = [x.detach() if isinstance(x, torch.Tensor) else x for x in args]
    torch.library.opcheck(lavo_chunk_bwd, args, test_utils=("test_schema", "test_faketensor"))
    # opcheck compares shapes and dtypes; Inductor also relies on the fakes' strides
    with FakeTensorMode() as mode:
        fakes = lavo_chunk_bwd(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args])
    for i, (fake, real) in enumerate(zip(fakes, lavo_chunk_bwd(*args), strict=True)):
        assert (fake.shape, fake.stride()) == (real.shape, real.stride()), i


@pytest.mark.parametrize("final_state, initial_state, queries", [(False, False, True), (True, True, True),
                                                                  (True, True, False)])
def test_opcheck_gsa(final_state, initial_state, queries):
    """The scan op with and without queries (NC's states-only scan)."""
    g = torch.Generator().manual_seed(3)
    tokens, heads, dim, slots, lengths = 40, 2, 16, 16, [24, 16]
    q, k, v = (torch.randn(tokens, heads, dim, generator=g, requires_grad=True) for _ in range(3))
    log_alpha = (-torch.rand(tokens, heads, slots, generator=g)).requires_grad_()
    h0 = [torch.randn(len(lengths), heads, slots, dim, generator=g, requires_grad=True) for _ in range(2)]
    args = (q if queries else None, k, v, log_alpha, *(h0 if initial_state else (None, None)), dim**-0.5, lengths,
            final_state)
    torch.library.opcheck(gsa_causal_fwd, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_opcheck_output_norm():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 2, 16, generator=g, requires_grad=True)
    weight = torch.randn(16, generator=g, requires_grad=True)
    torch.library.opcheck(silu_rms_norm_fwd, (x, weight, 1e-6))
