"""LAVO op: the float64 token-loop reference against hand-computed numbers, then the
chunked PyTorch path and the decode steps against the reference (docs/design.md §2.5)."""

import math

import pytest
import torch

from lavo_tasks.kernels.lavo import (
    LavoDecodeState,
    lavo_attn,
    lavo_cross_decode,
    lavo_decode_step,
    lavo_prefill,
    lavo_source,
)
from lavo_tasks.kernels.lavo.reference import reference_lavo_attn
from compare import assert_near

PATTERNS = {"CS": (True, False), "NS": (False, False), "CC": (True, True), "NC": (False, True)}


def make_inputs(pattern, n, m, *, window, segments=1, batch=2, heads=2, dim=8, rank=4, dtype=torch.float64, seed=0):
    """Random q, k, v, an orthonormal basis, nonzero biases; rel_bias None for NC."""
    causal, cross = PATTERNS[pattern]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dim, generator=g, dtype=torch.float64)
    k = torch.randn(batch, m, heads, dim, generator=g, dtype=torch.float64)
    v = torch.randn(batch, m, heads, dim, generator=g, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(heads, dim, rank, generator=g, dtype=torch.float64))[0].transpose(1, 2)
    rel_bias = None if pattern == "NC" else torch.randn(heads, window + (0 if causal else 1), generator=g, dtype=torch.float64)
    mem_bias = torch.randn((heads, segments) if segments > 1 else (heads,), generator=g, dtype=torch.float64)
    tensors = [q, k, v, basis, rel_bias, mem_bias]
    return [None if t is None else t.to(dtype).requires_grad_() for t in tensors]


def random_mask(batch, m, seed=1):
    mask = torch.rand(batch, m, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[:, 0] = True  # some real position in every row, and padding in the middle
    mask[0, 1] = False
    return mask


def outputs_and_grads(fn, inputs, upstream, **kwargs):
    """fn's output and the gradients of <output, upstream> w.r.t. every input (None stays None)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, **kwargs)
    (out * upstream.to(out.dtype)).sum().backward()
    return out.detach(), [None if t is None else t.grad for t in leaves]


# --- the reference against numbers computed by hand ---------------------------------------


def test_reference_matches_hand_computed_causal_case():
    # One head, d = 2, r = 1 with basis b = [1, 0], scale 1, window 2.
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    v = torch.tensor([[2.0, 4.0], [6.0, 8.0]])
    as_bthd = lambda x: x.double()[None, :, None, :]  # noqa: E731  [T, d] -> [1, T, 1, d]
    basis = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    rel_bias = torch.tensor([[0.5, -0.5]], dtype=torch.float64)  # rho[0], rho[1]
    mem_bias = torch.tensor([0.25], dtype=torch.float64)
    out = reference_lavo_attn(as_bthd(q), as_bthd(k), as_bthd(v), basis, rel_bias, mem_bias, window=2, scale=1.0)

    # t = 0: window {0}: 1 + rho[0] = 1.5; memory h = c_0 = 2, slot [2, 0]: q0 . slot + mu = 2.25
    z0 = math.exp(1.5) + math.exp(2.25)
    o0 = [(math.exp(1.5) * 2 + math.exp(2.25) * 2) / z0, math.exp(1.5) * 4 / z0]
    # t = 1: window {0, 1}: q1.k0 + rho[1] = 0.5, q1.k1 + rho[0] = 0.5; h = (2 + 6) / 2 = 4,
    # slot [4, 0]: q1 . slot + mu = 0.25
    z1 = 2 * math.exp(0.5) + math.exp(0.25)
    o1 = [(math.exp(0.5) * (2 + 6) + math.exp(0.25) * 4) / z1, math.exp(0.5) * (4 + 8) / z1]
    expected = torch.tensor([o0, o1], dtype=torch.float64)[None, :, None, :]
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_reference_matches_hand_computed_segmented_cross_case():
    # NC, basis = identity (r = d = 2, so c_j = v_j), 2 segments, position 1 is padding:
    # the valid positions 0, 2, 3 (ranks 0, 1, 2 of 3) fall in parts 0, 0, 1.
    v = torch.tensor([[1.0, 2.0], [100.0, 100.0], [3.0, 4.0], [5.0, -1.0]], dtype=torch.float64)[None, :, None, :]
    k = torch.zeros_like(v)
    q = torch.tensor([[[[1.0, 1.0]]]], dtype=torch.float64)
    basis = torch.eye(2, dtype=torch.float64)[None]
    mem_bias = torch.tensor([[0.0, 1.0]], dtype=torch.float64)  # [H, S]
    mask = torch.tensor([[True, False, True, True]])
    out = reference_lavo_attn(
        q, k, v, basis, None, mem_bias, window=2, causal=False, cross=True, segments=2, scale=1.0, kv_mask=mask
    )
    # part 0: h = mean(v0, v2) = [2, 3] -> slots [2, 0], [0, 3], logits 2, 3
    # part 1: h = v3 = [5, -1] -> slots [5, 0], [0, -1], logits 5 + 1, -1 + 1
    w = torch.softmax(torch.tensor([2.0, 3.0, 6.0, 0.0], dtype=torch.float64), 0)
    expected = torch.stack([2 * w[0] + 5 * w[2], 3 * w[1] - w[3]])
    torch.testing.assert_close(out[0, 0, 0], expected, rtol=1e-12, atol=1e-12)


# --- the PyTorch path against the reference ----------------------------------------------

CASES = [
    # pattern, n, m, window, segments, masked, scale
    ("CS", 9, 9, 3, 1, True, None),
    ("CS", 12, 12, 4, 1, False, None),
    ("CS", 9, 9, 1, 1, True, None),
    ("NS", 9, 9, 4, 1, True, None),
    ("NS", 12, 12, 2, 1, False, None),
    ("CC", 9, 12, 3, 1, True, None),
    ("CC", 12, 9, 4, 1, True, None),
    ("CC", 12, 9, 4, 1, False, None),
    ("NC", 9, 12, 4, 1, False, None),
    ("NC", 12, 9, 4, 3, True, None),
    # windows longer than the sequence, a source shorter than the window, more segments
    # than source positions, a caller's scale
    ("CS", 9, 9, 16, 1, True, 0.3),
    ("NS", 9, 9, 20, 1, True, None),
    ("CC", 9, 2, 5, 1, False, 0.3),
    ("NC", 5, 3, 4, 5, True, None),
]


@pytest.mark.parametrize("pattern,n,m,window,segments,masked,scale", CASES)
def test_torch_path_matches_reference_in_float64(pattern, n, m, window, segments, masked, scale):
    causal, cross = PATTERNS[pattern]
    inputs = make_inputs(pattern, n, m, window=window, segments=segments)
    kw = dict(
        window=window, causal=causal, cross=cross, segments=segments, scale=scale,
        kv_mask=random_mask(2, m) if masked else None,
    )
    upstream = torch.randn(2, n, 2, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    out, grads = outputs_and_grads(lambda *a, **k: lavo_attn(*a, backend="torch", **k), inputs, upstream, **kw)
    ref_out, ref_grads = outputs_and_grads(reference_lavo_attn, inputs, upstream, **kw)
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-10)
    for name, g, ref in zip(("q", "k", "v", "basis", "rel_bias", "mem_bias"), grads, ref_grads):
        if ref is None:
            assert g is None, name
            continue
        torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-10, msg=lambda s: f"grad {name}: {s}")


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_torch_path_float32_within_tolerance(pattern):
    causal, cross = PATTERNS[pattern]
    n, m, window, segments = 12, 9 if cross else 12, 4, 2 if pattern == "NC" else 1
    inputs = make_inputs(pattern, n, m, window=window, segments=segments, dtype=torch.float32, seed=3)
    kw = dict(window=window, causal=causal, cross=cross, segments=segments, kv_mask=random_mask(2, m, seed=4))
    upstream = torch.randn(2, n, 2, 8, generator=torch.Generator().manual_seed(8))
    out, grads = outputs_and_grads(lambda *a, **k: lavo_attn(*a, backend="torch", **k), inputs, upstream, **kw)
    inputs64 = [None if t is None else t.double() for t in inputs]
    ref_out, ref_grads = outputs_and_grads(reference_lavo_attn, inputs64, upstream, **kw)
    assert out.dtype == torch.float32
    assert_near(out, ref_out, 1e-4, "output")
    for name, g, ref in zip(("q", "k", "v", "basis", "rel_bias", "mem_bias"), grads, ref_grads):
        if ref is not None:
            assert_near(g, ref, 1e-4, f"grad {name}")


def test_torch_path_bfloat16_relative_rms():
    inputs = make_inputs("CS", 12, 12, window=4, dtype=torch.bfloat16, seed=5)
    out = lavo_attn(*inputs, window=4, backend="torch")
    ref = reference_lavo_attn(*[t.double() for t in inputs], window=4)
    assert out.dtype == torch.bfloat16
    rms = (out.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rms <= 5e-3, rms


def test_torch_path_ignores_autocast():
    """Computed in float32 even inside a bf16 autocast region (the design's fp32 accumulation)."""
    inputs = [t.detach() for t in make_inputs("CS", 12, 12, window=4, dtype=torch.float32, seed=6)]
    plain = lavo_attn(*inputs, window=4, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = lavo_attn(*inputs, window=4, backend="torch")
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, plain, rtol=1e-6, atol=1e-6)


def test_padding_never_contributes_and_padded_queries_are_zero():
    q, k, v, basis, rel_bias, mem_bias = (None if t is None else t.detach() for t in make_inputs("CS", 9, 9, window=3))
    mask = random_mask(2, 9)
    out = lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=3, kv_mask=mask, backend="torch")
    noise = torch.randn_like(k) * 100 * (~mask)[..., None, None]
    changed = lavo_attn(q, k + noise, v - noise, basis, rel_bias, mem_bias, window=3, kv_mask=mask, backend="torch")
    torch.testing.assert_close(out, changed)
    assert out[~mask].abs().max() == 0


# --- causality and packing ----------------------------------------------------------------


def test_causal_self_prefix_check():
    q, k, v, basis, rel_bias, mem_bias = (t.detach() for t in make_inputs("CS", 12, 12, window=4))
    full = lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=4, backend="torch")
    for t in range(12):
        cut = lavo_attn(q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], basis, rel_bias, mem_bias, window=4, backend="torch")
        torch.testing.assert_close(cut[:, t], full[:, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("m", [7, 12])
def test_causal_cross_prefix_check(m):
    q, k, v, basis, rel_bias, mem_bias = (t.detach() for t in make_inputs("CC", 10, m, window=3))
    kw = dict(window=3, causal=True, cross=True, backend="torch")
    full = lavo_attn(q, k, v, basis, rel_bias, mem_bias, **kw)
    for t in range(10):
        cut = lavo_attn(q[:, : t + 1], k, v, basis, rel_bias, mem_bias, **kw)  # target cut after t
        torch.testing.assert_close(cut[:, t], full[:, t], rtol=1e-12, atol=1e-12)
        later = torch.zeros_like(k)
        later[:, t + 1 :] = 50.0  # source positions after t must not matter to query t
        moved = lavo_attn(q, k + later, v - later, basis, rel_bias, mem_bias, **kw)
        torch.testing.assert_close(moved[:, : t + 1], full[:, : t + 1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pattern,window", [("CS", 3), ("NS", 4)])
def test_packed_sequences_equal_separate_runs(pattern, window):
    causal, _ = PATTERNS[pattern]
    q, k, v, basis, rel_bias, mem_bias = (t.detach() for t in make_inputs(pattern, 16, 16, window=window, batch=1))
    bounds = [0, 5, 5, 14, 16]  # lengths 5, 0, 9, 2
    mask = random_mask(1, 16, seed=9)
    kw = dict(window=window, causal=causal, backend="torch")
    packed = lavo_attn(q, k, v, basis, rel_bias, mem_bias, cu_seqlens=torch.tensor(bounds), kv_mask=mask, **kw)
    for s, e in zip(bounds, bounds[1:]):
        if e > s:
            alone = lavo_attn(q[:, s:e], k[:, s:e], v[:, s:e], basis, rel_bias, mem_bias, kv_mask=mask[:, s:e], **kw)
            torch.testing.assert_close(packed[:, s:e], alone, rtol=1e-12, atol=1e-12)
    reference = reference_lavo_attn(
        q, k, v, basis, rel_bias, mem_bias, window=window, causal=causal, cu_seqlens=torch.tensor(bounds), kv_mask=mask
    )
    torch.testing.assert_close(packed, reference, rtol=1e-9, atol=1e-10)


# --- decoding -----------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 4])
def test_decode_steps_equal_full_forward(window):
    q, k, v, basis, rel_bias, mem_bias = (t.detach() for t in make_inputs("CS", 11, 11, window=window))
    full = reference_lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=window)
    state = LavoDecodeState.empty(2, 2, 8, 4, window, dtype=torch.float64)
    steps = []
    for t in range(11):
        o, state = lavo_decode_step(
            q[:, t], k[:, t], v[:, t], basis, rel_bias, mem_bias, state, window=window, backend="torch"
        )
        steps.append(o)
        assert state.count == t + 1 and state.keys.shape == (2, 2, window - 1, 8)  # constant size
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("window,prompt", [(1, 4), (4, 2), (4, 7)])
def test_prefill_then_steps_equal_full_forward(window, prompt):
    q, k, v, basis, rel_bias, mem_bias = (t.detach() for t in make_inputs("CS", 11, 11, window=window))
    full = reference_lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=window)
    o, state = lavo_prefill(
        q[:, :prompt], k[:, :prompt], v[:, :prompt], basis, rel_bias, mem_bias, window=window, backend="torch"
    )
    steps = [o]
    for t in range(prompt, 11):
        o, state = lavo_decode_step(q[:, t], k[:, t], v[:, t], basis, rel_bias, mem_bias, state, window=window, backend="torch")
        steps.append(o[:, None])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pattern,m,segments", [("CC", 7, 1), ("CC", 14, 1), ("NC", 9, 3)])
def test_cross_decode_equals_full_forward(pattern, m, segments):
    causal, _ = PATTERNS[pattern]
    q, k, v, basis, rel_bias, mem_bias = (
        None if t is None else t.detach() for t in make_inputs(pattern, 11, m, window=3, segments=segments)
    )
    mask = random_mask(2, m)
    kw = dict(window=3, causal=causal, cross=True, segments=segments, kv_mask=mask)
    full = reference_lavo_attn(q, k, v, basis, rel_bias, mem_bias, **kw)
    source = lavo_source(k, v, basis, causal=causal, segments=segments, kv_mask=mask)
    chunks, start = [], 0
    for size in (1, 3, 1, 4, 2):  # uneven steps
        chunks.append(lavo_cross_decode(q[:, start : start + size], source, basis, rel_bias, mem_bias, window=3, start=start))
        start += size
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-10, atol=1e-12)


# --- argument errors ----------------------------------------------------------------------

BAD_ARGUMENTS = [
    (dict(window=0), "window=0"),
    (dict(pattern="NS", window=3), "window=3: noncausal self-attention needs an even window"),
    (dict(rank=9), "rank=9 must be between 1 and the head dim 8"),
    (dict(rel_bias_len=5), r"rel_bias: expected \[heads=2, 4\]"),
    (dict(segments=2), "segments=2: only noncausal cross-attention"),
    (dict(mem_bias_shape=(2, 3)), r"mem_bias: expected \[heads=2\]"),
    (dict(mask_dtype=torch.float32), "kv_mask: expected a bool tensor"),
    (dict(cu_seqlens=torch.tensor([0, 4, 12])), "cu_seqlens: packed sequences need batch size 1"),
    (dict(backend="cuda"), "backend='cuda'"),
]


@pytest.mark.parametrize("change,message", BAD_ARGUMENTS)
def test_bad_arguments_raise_clear_errors(change, message):
    pattern = change.pop("pattern", "CS")
    causal, cross = PATTERNS[pattern]
    window = change.pop("window", 4)
    q = torch.zeros(2, 12, 2, 8)
    basis = torch.zeros(2, change.pop("rank", 4), 8)
    rel_bias = torch.zeros(2, change.pop("rel_bias_len", window + (0 if causal else 1)))
    mem_bias = torch.zeros(change.pop("mem_bias_shape", (2,)))
    kv_mask = torch.ones(2, 12, dtype=change.pop("mask_dtype", torch.bool))
    with pytest.raises(ValueError, match=message):
        lavo_attn(q, q, q, basis, rel_bias, mem_bias, window=window, causal=causal, cross=cross, kv_mask=kv_mask, **change)


def test_decode_step_rejects_a_state_of_another_window():
    x = torch.zeros(2, 2, 8)
    state = LavoDecodeState.empty(2, 2, 8, 4, window=3)
    with pytest.raises(ValueError, match=r"state.keys/values \(2, 2, 2, 8\): expected \(2, 2, 3, 8\)"):
        lavo_decode_step(x, x, x, torch.zeros(2, 4, 8), torch.zeros(2, 4), torch.zeros(2), state, window=4)


def test_auto_backend_falls_back_for_what_the_kernels_do_not_cover(monkeypatch):
    # The Triton kernels take no float64: under "auto" (here steered to Triton through the
    # environment) the PyTorch path answers with a warning; an explicit "triton" raises.
    q, k, v, basis, rel_bias, mem_bias = make_inputs("CS", 9, 9, window=3)
    monkeypatch.setenv("LAVO_TASKS_BACKEND", "triton")
    with pytest.warns(RuntimeWarning, match="float64"):
        o = lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=3)
    expected = reference_lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=3)
    assert_near(o, expected, 1e-10, "fallback output")
    with pytest.raises(NotImplementedError, match="float64"):
        lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=3, backend="triton")
