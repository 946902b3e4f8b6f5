"""GSA Triton kernels against the token-loop reference, on the CPU through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without a GPU).

fp32 kernels vs the float64 reference: max abs error <= 1e-4 relative to the reference
tensor's max abs, on outputs, final states and the gradients of q, k, v, log_alpha and
the initial state (docs/design.md §2.5). Shapes are small (the interpreter is slow)
but cross the kernels' tiles: sub-chunks of 16 and chunks of 64 positions, odd head dims
and slot counts (padded inside to 16).
"""

import pytest
import torch
import torch.nn.functional as F

from lavo_tasks.kernels.gsa import chunk
from lavo_tasks.kernels.gsa.chunk import chunk_gsa_attn
from lavo_tasks.kernels.gsa.output_norm import silu_rms_norm
from lavo_tasks.kernels.gsa.recurrent import recurrent_gsa_step
from lavo_tasks.kernels.gsa.reference import reference_gsa_attn

TOL = 1e-4


def _inputs(batch, n, m, heads=1, dk=12, dv=20, slots=5, seed=0, gate_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dk, generator=g)
    k = torch.randn(batch, m, heads, dk, generator=g)
    v = torch.randn(batch, m, heads, dv, generator=g)
    log_alpha = F.logsigmoid(torch.randn(batch, m, heads, slots, generator=g) * gate_scale) / 2
    return [q, k, v, log_alpha]


def _states(n_states, heads, dk, dv, slots, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n_states, heads, slots, d, generator=g) for d in (dk, dv)]


def _run(fn, dtype, xs, states, **kw):
    """Outputs, final state and gradients of a fixed random projection of both."""
    xs = [x.to(dtype).detach().requires_grad_() for x in xs]
    states = None if states is None else [s.to(dtype).detach().requires_grad_() for s in states]
    o, final = fn(*xs, initial_state=states, output_final_state=True, **kw)
    g = torch.Generator().manual_seed(2)
    loss = (o.double() * torch.randn(o.shape, generator=g, dtype=torch.float64)).sum()  # same weights at any dtype
    loss = loss + sum((s.double() * torch.randn(s.shape, generator=g, dtype=torch.float64)).sum() for s in final)
    loss.backward()
    grads = [x.grad for x in xs] + ([] if states is None else [s.grad for s in states])
    return [o, *final, *grads]


def _assert_matches_reference(xs, states=None, **kw):
    names = ["o", "K~_T", "V~_T", "dq", "dk", "dv", "dlog_alpha", "dK~_0", "dV~_0"]
    fast = _run(chunk_gsa_attn, torch.float32, xs, states, **kw)
    ref = _run(reference_gsa_attn, torch.float64, xs, states, **kw)
    for name, a, b in zip(names, fast, ref):
        assert a.dtype == torch.float32 and a.shape == b.shape, name
        error = ((a.double() - b).abs().max() / b.abs().max()).item()
        assert error <= TOL, f"{name}: relative error {error:.2e}"


def test_causal_three_chunks_with_states():
    """T = 150: three chunks, a partial last chunk and sub-chunk; states in and out."""
    xs = _inputs(1, 150, 150, heads=2)
    _assert_matches_reference(xs, _states(1, 2, 12, 20, 5))


def test_causal_batch_odd_sizes_and_padding():
    xs = _inputs(2, 70, 70, dk=9, dv=17, slots=19, seed=3)
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[0, 5] = mask[0, 40:44] = False
    mask[1, 50:] = False
    _assert_matches_reference(xs, _states(2, 1, 9, 17, 19), kv_mask=mask)


@pytest.mark.parametrize("used", ["state", "output", "K~ alone"])
def test_only_the_final_state_or_only_the_output_reaches_the_loss(used):
    """The other outputs' gradients arrive as None (unused), read as zeros; an input that
    reaches none of the read outputs (q with the state alone, v with K~ alone) gets a
    zero gradient or none."""
    xs = _inputs(1, 80, 80, heads=2, seed=5)

    def grads(fn, dtype):
        leaves = [x.to(dtype).detach().requires_grad_() for x in xs]
        o, final = fn(*leaves, output_final_state=True)
        g = torch.Generator().manual_seed(6)
        read = {"state": final, "output": [o], "K~ alone": final[:1]}[used]
        sum((t.double() * torch.randn(t.shape, generator=g, dtype=torch.float64)).sum() for t in read).backward()
        return [x.grad for x in leaves]

    fast, ref = grads(chunk_gsa_attn, torch.float32), grads(reference_gsa_attn, torch.float64)
    unreached = {"state": {"dq"}, "output": set(), "K~ alone": {"dq", "dv"}}[used]
    for name, a, b in zip(["dq", "dk", "dv", "dlog_alpha"], fast, ref):
        if name in unreached:
            assert b is None and (a is None or not a.any()), name
            continue
        error = ((a.double() - b).abs().max() / b.abs().max()).item()
        assert error <= TOL, f"{name}: relative error {error:.2e}"


def test_causal_extreme_gates_stay_finite():
    """Gates down to exp(-40) per step: every decay inside a chunk is exp(<= 0)."""
    xs = _inputs(1, 40, 40, seed=4)
    g = torch.Generator().manual_seed(5)
    xs[3] = -40 * torch.rand(xs[3].shape, generator=g) ** 4
    _assert_matches_reference(xs)


def test_strong_decays_through_the_products():
    """Gates of about -0.85 per step: each chunk decays by exp(-51) to exp(-55), under SPAN,
    so the products carry factors up to exp(55) and their inverses; fp32 keeps them exact."""
    xs = _inputs(1, 130, 130, heads=2, seed=21)
    g = torch.Generator().manual_seed(22)
    xs[3] = -0.85 * (0.5 + torch.rand(xs[3].shape, generator=g))
    first_chunk = xs[3][:, 1:64].sum(1).neg()  # the decay across chunk 0, per slot
    assert 50 < first_chunk.min() and first_chunk.max() < chunk.SPAN
    _assert_matches_reference(xs, _states(1, 2, 12, 20, 5))


@pytest.mark.parametrize("span", [0.0, 1e4])
def test_both_diagonal_paths(monkeypatch, span):
    """Pairs inside a sub-chunk: row loop everywhere (SPAN 0) or products everywhere."""
    monkeypatch.setattr(chunk, "SPAN", span)
    xs = _inputs(1, 40, 40, seed=12)
    _assert_matches_reference(xs, _states(1, 1, 12, 20, 5))


@pytest.mark.parametrize("span", [0.0, 1e4])
def test_whole_chunk_kernels_in_blocks(monkeypatch, span):
    """The whole-chunk kernels with their intra-chunk split in blocks of 16 rows (one
    reference row each; the default is one block per chunk), both diagonal paths, a
    partial last block; states in and out."""
    monkeypatch.setattr(chunk, "WHOLE_BC", 16)
    monkeypatch.setattr(chunk, "SPAN", span)
    _assert_matches_reference(_inputs(1, 90, 90, seed=17), _states(1, 1, 12, 20, 5))


def test_sub_chunk_kernels_at_small_sizes(monkeypatch):
    """The per-sub-chunk kernels (those of slot counts over 64 or head dims over 128) on
    the small shapes the whole-chunk kernels take by default."""
    monkeypatch.setattr(chunk, "WHOLE_MAX_SLOTS", 0)
    _assert_matches_reference(_inputs(1, 150, 150, heads=2), _states(1, 2, 12, 20, 5))


def test_compiled_loop_path(monkeypatch):
    """The `for` loops the GPU runs (the interpreter itself takes `while` loops: under
    numpy 2 it cannot turn a 1-element loop bound into an int; patched here to do so)."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    if not hasattr(interpreter, "_patch_lang_tensor"):
        pytest.fail("triton.runtime.interpreter._patch_lang_tensor is gone: update this test")
    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)
    monkeypatch.setattr(chunk, "WHILE_LOOPS", False)
    cu = torch.tensor([0, 70, 70, 100])
    _assert_matches_reference(_inputs(1, 100, 100, seed=13), _states(3, 1, 12, 20, 5), cu_seqlens=cu)


# NS's two directions as one scan (a bound above every test shape) or as two (bound 0)
ONE_SCAN = 10**9
NS_FORMS = pytest.mark.parametrize("one_scan_programs", [ONE_SCAN, 0], ids=["one scan", "two scans"])


@NS_FORMS
def test_noncausal_self_with_padding(monkeypatch, one_scan_programs):
    monkeypatch.setattr(chunk, "NS_ONE_SCAN_PROGRAMS", one_scan_programs)
    xs = _inputs(2, 37, 37, seed=6)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = mask[0, 0] = False
    _assert_matches_reference(xs, _states(2, 1, 12, 20, 5), causal=False, kv_mask=mask)


@pytest.mark.parametrize("batch,length,heads,scans", [(2, 37, 1, [4]), (2, 37, 2, [2, 2]), (1, 130, 1, [1, 1])],
                         ids=["2 programs a direction", "4 programs", "3 programs"])
def test_noncausal_self_runs_one_scan_below_the_bound(monkeypatch, batch, length, heads, scans):
    """With the bound at 3 programs (chunks x heads of one direction), NS below it runs one
    scan over 2B sequences, and at or above it two scans over B each."""
    monkeypatch.setattr(chunk, "NS_ONE_SCAN_PROGRAMS", 3)
    seen, causal = [], chunk._causal

    def counting(*args):
        seen.append(len(args[6]))  # the scan's sequence lengths
        return causal(*args)

    monkeypatch.setattr(chunk, "_causal", counting)
    chunk_gsa_attn(*_inputs(batch, length, length, heads=heads), causal=False)
    assert seen == scans


@NS_FORMS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_noncausal_self_in_half_precision_is_the_rounded_fp32_mean_of_the_two_scans(monkeypatch, dtype,
                                                                                     one_scan_programs):
    """NS averages the two scans: bf16 rounds the sum once and halves it exactly, fp16
    (whose sums overflow at 65,504) averages in fp32; both give, bit for bit, the fp32
    mean rounded to the inputs' dtype."""
    monkeypatch.setattr(chunk, "NS_ONE_SCAN_PROGRAMS", one_scan_programs)
    q, k, v, log_alpha = (x.to(dtype) for x in _inputs(2, 21, 21, seed=9))
    forward, _ = chunk_gsa_attn(q, k, v, log_alpha)
    backward, _ = chunk_gsa_attn(*(x.flip(1) for x in (q, k, v, log_alpha)))
    want = ((forward.float() + backward.flip(1).float()) / 2).to(dtype)
    got, _ = chunk_gsa_attn(q, k, v, log_alpha, causal=False)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got, want)


CROSS_FORMS = pytest.mark.parametrize("one_scan", [True, False], ids=["one scan", "a read of the final state"])


def _cross_form(monkeypatch, one_scan):
    """Bound the one-scan form of the cross patterns so that `one_scan` decides it, and
    make the other form's PyTorch read raise where the one scan should run."""
    monkeypatch.setattr(chunk, "CROSS_ONE_SCAN_ROWS", 10**9 if one_scan else 0)
    if one_scan:
        monkeypatch.setattr(chunk, "_read_final", _no_read)


def _no_read(*_):
    raise AssertionError("the read of the final state ran in the one-scan form")


@pytest.mark.parametrize("n,m,one_scan", [(21, 34, True), (34, 21, True), (34, 21, False), (70, 21, True),
                                          (70, 21, False)])
def test_causal_cross(monkeypatch, n, m, one_scan):
    """Targets shorter and longer than the source (70: past a 64-position chunk), a longer
    one in both forms: one scan over padded source positions (eager), or the queries past
    the source reading its final state (compiled, and large scans); a shorter target
    always pads its queries."""
    _cross_form(monkeypatch, one_scan)
    xs = _inputs(2, n, m, seed=7)
    mask = torch.ones(2, m, dtype=torch.bool)
    mask[1, m - 4:] = False
    _assert_matches_reference(xs, _states(2, 1, 12, 20, 5), cross=True, kv_mask=mask)


@CROSS_FORMS
@pytest.mark.parametrize("n,m", [(19, 26), (40, 50)])
def test_noncausal_cross(monkeypatch, n, m, one_scan):
    """NC in both forms: the eager one (one scan over the source, then the target; 90
    positions cross a chunk) and the compiled one (the source's states, then a read of
    the final one), with padding at the end of one source."""
    _cross_form(monkeypatch, one_scan)
    xs = _inputs(2, n, m, seed=8)
    mask = torch.ones(2, m, dtype=torch.bool)
    mask[0, m - 5:] = False
    _assert_matches_reference(xs, _states(2, 1, 12, 20, 5), causal=False, cross=True, kv_mask=mask)


class _Forbidden:
    def __getitem__(self, grid):
        raise AssertionError("a kernel that reads the states ran")


@pytest.mark.parametrize("pattern", ["CC", "NC"])
def test_compiled_calls_and_large_scans_read_the_final_state(monkeypatch, pattern):
    """The read form runs while torch.compile traces (is_compiling), and eagerly above
    CROSS_ONE_SCAN_ROWS rows x heads; the one scan below it."""
    reads = []
    real = chunk._read_final
    monkeypatch.setattr(chunk, "_read_final", lambda *a: reads.append(1) or real(*a))
    xs = _inputs(1, 30, 20, seed=9)  # one scan of 30 (CC) or 50 (NC) rows, 1 head
    rows = 30 if pattern == "CC" else 50

    def run():
        chunk_gsa_attn(*xs, causal=pattern == "CC", cross=True)
        return len(reads)

    monkeypatch.setattr(chunk, "CROSS_ONE_SCAN_ROWS", rows)
    assert run() == 0
    monkeypatch.setattr(chunk, "CROSS_ONE_SCAN_ROWS", rows - 1)
    assert run() == 1
    monkeypatch.setattr(chunk, "CROSS_ONE_SCAN_ROWS", 10**9)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert run() == 2


@pytest.mark.parametrize("slots", [5, 80], ids=["whole-chunk kernels", "per-sub-chunk kernels"])
def test_noncausal_cross_scans_without_reading_the_states(monkeypatch, slots):
    """NC's compiled form: its source scan writes the states only: neither the output
    kernel nor the query side of the backward runs, and the outputs and every gradient
    still match the reference (80 slots: the per-sub-chunk kernels)."""
    monkeypatch.setattr(chunk, "CROSS_ONE_SCAN_ROWS", 0)
    for module, name in [(chunk.W, "_whole_output_kernel"), (chunk.W, "_whole_query_bwd_kernel"),
                         (chunk.K, "_output_fwd_kernel"), (chunk.K, "_query_bwd_kernel"),
                         (chunk.K, "_chunk_read_grad_kernel")]:
        monkeypatch.setattr(module, name, _Forbidden())
    xs = _inputs(2, 19, 26, slots=slots, seed=8)
    _assert_matches_reference(xs, _states(2, 1, 12, 20, slots), causal=False, cross=True)


@pytest.mark.parametrize("causal,one_scan_programs", [(True, 0), (False, ONE_SCAN), (False, 0)],
                         ids=["CS", "NS one scan", "NS two scans"])
def test_packed_sequences(monkeypatch, causal, one_scan_programs):
    """cu_seqlens: sequences of 5, 0, 17 and 50 packed in batch 1, one initial state each
    (the empty one returns its initial state)."""
    monkeypatch.setattr(chunk, "NS_ONE_SCAN_PROGRAMS", one_scan_programs)
    cu = torch.tensor([0, 5, 5, 22, 72])
    xs = _inputs(1, 72, 72, seed=9)
    _assert_matches_reference(xs, _states(4, 1, 12, 20, 5), causal=causal, cu_seqlens=cu)


def test_packed_equals_separate_runs():
    cu = [0, 23, 30, 47]
    xs = _inputs(1, 47, 47, seed=10)
    packed, final = chunk_gsa_attn(*xs, cu_seqlens=torch.tensor(cu), output_final_state=True)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        alone, alone_final = chunk_gsa_attn(*(x[:, a:b] for x in xs), output_final_state=True)
        torch.testing.assert_close(packed[:, a:b], alone, rtol=0, atol=1e-5)
        torch.testing.assert_close(final[0][i], alone_final[0][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(final[1][i], alone_final[1][0], rtol=0, atol=1e-5)


def test_decode_steps_match_reference():
    q, k, v, log_alpha = _inputs(2, 6, 6, heads=2, seed=11)
    state = _states(2, 2, 12, 20, 5)
    ref, ref_final = reference_gsa_attn(
        *(x.double() for x in (q, k, v, log_alpha)), initial_state=[s.double() for s in state],
        output_final_state=True)
    outputs = []
    for t in range(6):
        o, state = recurrent_gsa_step(q[:, t], k[:, t], v[:, t], log_alpha[:, t], state)
        outputs.append(o)
    torch.testing.assert_close(torch.stack(outputs, 1).double(), ref, rtol=0, atol=TOL * ref.abs().max().item())
    for s, r in zip(state, ref_final):
        assert s.dtype == torch.float32
        torch.testing.assert_close(s.double(), r, rtol=0, atol=TOL * r.abs().max().item())


@pytest.mark.parametrize(
    "span, dk, dv, slots, n",
    [(chunk.SPAN, 256, 130, 256, 70), (0.0, 100, 256, 70, 20)],
    ids=["256 slots, two chunks, products", "dv 256, row loop"],
)
def test_head_dims_and_slots_up_to_256(monkeypatch, span, dk, dv, slots, n):
    """Head dims over one column block (64; 32 with more than 128 slots), partial column
    blocks and 256 slots: products by blocks, states in and out. The pairs inside a
    sub-chunk take the products (default SPAN) in the widest case, over two chunks, and
    the row loop (SPAN 0), the slower one under the interpreter, in the other; both
    paths on one shape: test_both_diagonal_paths."""
    monkeypatch.setattr(chunk, "SPAN", span)
    xs = _inputs(1, n, n, dk=dk, dv=dv, slots=slots, seed=15 if n > 64 else 16)
    _assert_matches_reference(xs, _states(1, 1, dk, dv, slots))


def test_uncovered_cases_raise_not_implemented():
    xs = _inputs(1, 4, 4, dk=257)
    with pytest.raises(NotImplementedError, match="dk=257"):
        chunk_gsa_attn(*xs)
    with pytest.raises(NotImplementedError, match="float64"):
        chunk_gsa_attn(*(x.double() for x in _inputs(1, 4, 4)))


@pytest.mark.parametrize("slots_prec,values_prec", [("tf32x3", "bf16"), ("bf16x3", "bf16"), ("bf16", "bf16")])
def test_bf16_dot_precision_families(monkeypatch, slots_prec, values_prec):
    """bf16 inputs with bf16-operand dots (the kernels round the operands to the nearest
    bf16 as the GPU does) against the float64 reference on the same bf16-rounded inputs.
    The interpreter stores bf16 outputs rounded toward zero (the GPU: to nearest), which
    alone leaves 2-4e-3 relative RMS here; 1e-2 checks the bf16-operand path, the 5e-3
    limit is checked on the GPU (tests/kernels/test_gpu_gsa.py)."""
    monkeypatch.setattr(chunk, "PREC_SLOTS", slots_prec)
    monkeypatch.setattr(chunk, "PREC_VALUES", values_prec)
    xs = [x.to(torch.bfloat16) for x in _inputs(1, 70, 70, heads=2, seed=14)]
    fast = _run(chunk_gsa_attn, torch.bfloat16, xs, None)
    ref = _run(reference_gsa_attn, torch.float64, xs, None)
    for name, a, b in zip(["o", "K~_T", "V~_T", "dq", "dk", "dv", "dlog_alpha"], fast, ref):
        error = ((a.double() - b).norm() / b.norm()).item()
        assert error <= 1e-2, f"{name}: relative RMS error {error:.2e}"


@pytest.mark.parametrize(
    "dtype,d,eps,tol",
    [(torch.float32, 20, 1e-6, 1e-5), (torch.float32, 64, 1e-6, 1e-5), (torch.bfloat16, 64, 1e-6, 2e-2),
     (torch.float32, 64, 0.5, 1e-5)],  # an eps comparable to mean(a^2): a wrong eps would show
)
def test_fused_silu_rms_norm(dtype, d, eps, tol):
    """The GSA layer's output norm on Triton against the float64 formula (autograd of
    elementary ops): output, input and weight gradients; 150 rows (three programs, the
    last partial), an odd head dim padded inside, a non-contiguous input."""
    g = torch.Generator().manual_seed(30)
    x = (torch.randn(3, 2 * d, 50, generator=g) * 2).to(dtype).transpose(1, 2)[..., ::2].requires_grad_()
    w = (1 + 0.1 * torch.randn(d, generator=g)).requires_grad_()
    dy = torch.randn(3, 50, d, generator=g).to(dtype)
    y = silu_rms_norm(x, w, eps, use_triton=True)
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    a = x64 * torch.sigmoid(x64)
    ref = a / torch.sqrt((a * a).mean(-1, keepdim=True) + eps) * w64
    ref.backward(dy.double())
    assert y.dtype == dtype and x.grad.dtype == dtype and w.grad.dtype == torch.float32
    for name, got, want in (("y", y, ref), ("dx", x.grad, x64.grad), ("dweight", w.grad, w64.grad)):
        error = ((got.double() - want).abs().max() / want.abs().max()).item()
        assert error <= tol, f"{name}: relative error {error:.2e}"
