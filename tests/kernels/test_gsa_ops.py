"""GSA functional op on the PyTorch path, against the token-loop reference and by hand.

Tolerances are docs/design.md §2.5: fp32 max abs error <= 1e-4 of the reference
tensor's max abs; float64 much tighter; bf16 relative RMS <= 5e-3.
"""

import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from lavo_tasks.kernels import gsa_attn, gsa_decode_step
from lavo_tasks.kernels.gsa import torch_path
from lavo_tasks.kernels.gsa.reference import reference_gsa_attn
from compare import assert_near

PATTERNS = {"CS": (True, False), "NS": (False, False), "CC": (True, True), "NC": (False, True)}


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------- the reference, by hand


def _hand_inputs():
    """T = 2, M = 2, dk = dv = 1 (scale 1): q = (1, 2), k = (1, -1), v = (2, 3),
    alpha_0 = (1/2, 1/4), alpha_1 = (1/2, 1)."""
    q = torch.tensor([1.0, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    k = torch.tensor([1.0, -1.0], dtype=torch.float64).view(1, 2, 1, 1)
    v = torch.tensor([2.0, 3.0], dtype=torch.float64).view(1, 2, 1, 1)
    log_alpha = torch.tensor([[0.5, 0.25], [0.5, 1.0]], dtype=torch.float64).log().view(1, 2, 1, 2)
    return q, k, v, log_alpha


def test_reference_by_hand_causal_self():
    # t=0: s=(1/2, 3/4): K~=(1/2, 3/4), V~=(1, 3/2); logits (1/2, 3/4) -> o = 1 + sigmoid(1/4)/2
    # t=1: s=(1/2, 0):   K~=(-1/4, 3/4), V~=(2, 3/2); logits (-1/2, 3/2) -> o = 3/2 + sigmoid(-2)/2
    o, (state_k, state_v) = reference_gsa_attn(*_hand_inputs(), output_final_state=True)
    expected = torch.tensor([1 + sigmoid(0.25) / 2, 1.5 + sigmoid(-2.0) / 2], dtype=torch.float64)
    torch.testing.assert_close(o.flatten(), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_k.flatten(), torch.tensor([-0.25, 0.75], dtype=torch.float64))
    torch.testing.assert_close(state_v.flatten(), torch.tensor([2.0, 1.5], dtype=torch.float64))


def test_reference_by_hand_noncausal_self():
    # right-to-left from zeros: after t=1 K~=(-1/2, 0), V~=(3/2, 0); logits (-1, 0)
    # after t=0: K~=(1/4, 3/4), V~=(7/4, 3/2); logits (1/4, 3/4)
    o, _ = reference_gsa_attn(*_hand_inputs(), causal=False)
    o_lr = [1 + sigmoid(0.25) / 2, 1.5 + sigmoid(-2.0) / 2]
    o_rl = [1.75 * sigmoid(-0.5) + 1.5 * sigmoid(0.5), 1.5 * sigmoid(-1.0)]
    expected = torch.tensor([(a + b) / 2 for a, b in zip(o_lr, o_rl)], dtype=torch.float64)
    torch.testing.assert_close(o.flatten(), expected, rtol=0, atol=1e-12)


def test_reference_by_hand_cross():
    q, k, v, log_alpha = _hand_inputs()
    target = torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64).view(1, 3, 1, 1)
    # CC: t=0 and t=1 as in causal self; t=2 reads the final state K~=(-1/4, 3/4), V~=(2, 3/2)
    o, _ = reference_gsa_attn(target, k, v, log_alpha, cross=True)
    expected = [1 + sigmoid(0.25) / 2, 1.5 + sigmoid(-2.0) / 2, 2 * sigmoid(-1.0) + 1.5 * sigmoid(1.0)]
    torch.testing.assert_close(o.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # NC: every query reads the final state; logits = q * (-1/4, 3/4)
    o, _ = reference_gsa_attn(target, k, v, log_alpha, causal=False, cross=True)
    expected = [2 * sigmoid(-q_t) + 1.5 * sigmoid(q_t) for q_t in (1.0, 2.0, 1.0)]
    torch.testing.assert_close(o.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_reference_by_hand_padding_and_initial_state():
    q, k, v, log_alpha = _hand_inputs()
    state = (torch.tensor([2.0, 0.0], dtype=torch.float64).view(1, 1, 2, 1),
             torch.tensor([4.0, 8.0], dtype=torch.float64).view(1, 1, 2, 1))
    # position 1 is padding: its output is 0 and the state after it is the one after t=0:
    # K~ = (1/2*2 + 1/2, 3/4) = (3/2, 3/4), V~ = (1/2*4 + 1, 1/4*8 + 3/2) = (3, 7/2);
    # logits at t=0 are (3/2, 3/4), so p = (sigmoid(3/4), sigmoid(-3/4))
    o, (state_k, state_v) = reference_gsa_attn(q, k, v, log_alpha, initial_state=state, output_final_state=True,
                                               kv_mask=torch.tensor([[True, False]]))
    expected = [3 * sigmoid(0.75) + 3.5 * sigmoid(-0.75), 0.0]
    torch.testing.assert_close(o.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(state_k.flatten(), torch.tensor([1.5, 0.75], dtype=torch.float64))
    torch.testing.assert_close(state_v.flatten(), torch.tensor([3.0, 3.5], dtype=torch.float64))


# ---------------------------------------------------------------- torch path vs reference


def make_inputs(batch, n, m, heads, dk, dv, slots, dtype, *, seed=0, gate_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dk, generator=g)
    k = torch.randn(batch, m, heads, dk, generator=g)
    v = torch.randn(batch, m, heads, dv, generator=g)
    log_alpha = F.logsigmoid(gate_scale * torch.randn(batch, m, heads, slots, generator=g)) / 2
    state = (torch.randn(batch, heads, slots, dk, generator=g), torch.randn(batch, heads, slots, dv, generator=g))
    mask = torch.rand(batch, m, generator=g) > 0.25
    mask[:, :1] = True
    return [x.to(dtype) for x in (q, k, v, log_alpha)], [s.to(dtype) for s in state], mask


def run_with_grads(fn, tensors, state, *, seed=1, **kwargs):
    """Outputs and gradients of q, k, v, log_alpha and the initial state, for a random
    weighting of the output and of the final state."""
    leaves = [x.detach().clone().requires_grad_() for x in tensors + state]
    o, final = fn(*leaves[:4], initial_state=tuple(leaves[4:]), output_final_state=True, **kwargs)
    g = torch.Generator().manual_seed(seed)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)).sum() for t in (o, *final))
    grads = torch.autograd.grad(loss, leaves)
    return [o, *final], grads


NAMES = ("o", "final K~", "final V~", "grad q", "grad k", "grad v", "grad log_alpha",
         "grad initial K~", "grad initial V~")


@pytest.mark.parametrize("dtype,rel", [(torch.float64, 1e-10), (torch.float32, 1e-4)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("pattern,n,m", [
    ("CS", 37, 37), ("CS", 9, 9), ("NS", 37, 37), ("NS", 12, 12),
    ("CC", 12, 9), ("CC", 9, 12), ("CC", 37, 21), ("NC", 9, 12), ("NC", 12, 37),
])
def test_torch_path_matches_reference(pattern, n, m, dtype, rel):
    """Odd sizes (head dim 8, 5 slots), lengths across chunk boundaries, padding, initial
    and final states, gradients of every input."""
    causal, cross = PATTERNS[pattern]
    tensors, state, mask = make_inputs(2, n, m, 2, 8, 8, 5, dtype)
    kwargs = dict(causal=causal, cross=cross, kv_mask=mask)
    got, got_grads = run_with_grads(gsa_attn, tensors, state, backend="torch", **kwargs)
    want, want_grads = run_with_grads(reference_gsa_attn, [x.double() for x in tensors],
                                      [s.double() for s in state], **kwargs)
    assert got[0].dtype == dtype
    for name, a, b in zip(NAMES, got + list(got_grads), want + list(want_grads)):
        assert_near(a, b, rel, f"{pattern} {name}")
    if not cross:
        assert (got[0][~mask] == 0).all(), "padded queries must output 0"


def test_torch_path_other_head_dims_and_no_state():
    """dk != dv, one slot, no initial state, no mask."""
    tensors, _, _ = make_inputs(1, 20, 20, 3, 4, 7, 1, torch.float64, seed=3)
    for pattern, (causal, cross) in PATTERNS.items():
        o, final = gsa_attn(*tensors, causal=causal, cross=cross, output_final_state=True, backend="torch")
        o_ref, final_ref = reference_gsa_attn(*tensors, causal=causal, cross=cross, output_final_state=True)
        for a, b in zip((o, *final), (o_ref, *final_ref)):
            assert_near(a, b, 1e-10, pattern)


def test_extreme_gates_stay_finite_and_exact():
    """Gates near 0 (log alpha = -60 per step: a chunk's cumulative sum reaches -960) must
    not overflow: within a chunk only differences of cumulative sums are exponentiated."""
    tensors, state, _ = make_inputs(1, 40, 40, 2, 8, 8, 5, torch.float32, seed=4)
    tensors[3] = torch.where(torch.rand(tensors[3].shape, generator=torch.Generator().manual_seed(5)) < 0.5,
                             torch.full_like(tensors[3], -60.0), tensors[3])
    for causal in (True, False):
        got, got_grads = run_with_grads(gsa_attn, tensors, state, causal=causal, backend="torch")
        want, want_grads = run_with_grads(reference_gsa_attn, [x.double() for x in tensors],
                                          [s.double() for s in state], causal=causal)
        for name, a, b in zip(NAMES, got + list(got_grads), want + list(want_grads)):
            assert torch.isfinite(a).all(), name
            assert_near(a, b, 1e-4, name)


def test_bf16_inputs():
    tensors, state, mask = make_inputs(2, 33, 33, 2, 16, 16, 8, torch.bfloat16, seed=6)
    o, final = gsa_attn(*tensors, initial_state=tuple(s.float() for s in state), output_final_state=True,
                        kv_mask=mask, backend="torch")
    assert o.dtype == torch.bfloat16 and final[0].dtype == torch.float32
    o_ref, final_ref = reference_gsa_attn(*[x.double() for x in tensors], initial_state=[s.double() for s in state],
                                          output_final_state=True, kv_mask=mask)
    for a, b in zip((o, *final), (o_ref, *final_ref)):
        rms = (a.double() - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()
        assert rms <= 5e-3


# ---------------------------------------------------------------- packing, causality, decode


@pytest.mark.parametrize("pattern", ["CS", "NS"])
def test_cu_seqlens_packing_equals_separate_sequences(pattern):
    causal = pattern == "CS"
    lengths = [9, 20, 0, 1, 12]  # an empty sequence passes its initial state through
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    tensors, state, mask = make_inputs(1, sum(lengths), sum(lengths), 2, 8, 6, 5, torch.float32, seed=7)
    state = [torch.randn(len(lengths), *s.shape[1:]) for s in state]
    got, got_grads = run_with_grads(gsa_attn, tensors, state, causal=causal, kv_mask=mask, cu_seqlens=cu,
                                    backend="torch")
    outputs, finals_k, finals_v = [], [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        o, (fk, fv) = gsa_attn(*(x[:, a:b] for x in tensors), causal=causal, kv_mask=mask[:, a:b],
                               initial_state=(state[0][i:i + 1], state[1][i:i + 1]), output_final_state=True,
                               backend="torch")
        outputs.append(o)
        finals_k.append(fk)
        finals_v.append(fv)
    separate = [torch.cat(outputs, dim=1), torch.cat(finals_k), torch.cat(finals_v)]
    for name, a, b in zip(NAMES, got, separate):
        assert_near(a, b, 1e-5, name)
    # and the gradients against the reference, which runs each packed sequence alone
    want, want_grads = run_with_grads(reference_gsa_attn, [x.double() for x in tensors], [s.double() for s in state],
                                      causal=causal, kv_mask=mask, cu_seqlens=cu)
    for name, a, b in zip(NAMES, got + list(got_grads), want + list(want_grads)):
        assert_near(a, b, 1e-4, name)


@pytest.mark.parametrize("pattern", ["CS", "CC"])
def test_causality_prefix(pattern):
    """The output at t on the full input equals the output at t on the input cut after t."""
    cross = pattern == "CC"
    n, m = 26, 19 if cross else 26
    (q, k, v, log_alpha), _, _ = make_inputs(1, n, m, 2, 8, 8, 5, torch.float64, seed=8)
    full, _ = gsa_attn(q, k, v, log_alpha, cross=cross, backend="torch")
    for t in (0, 5, 16, 18, 25):
        cut = slice(0, t + 1)
        o, _ = gsa_attn(q[:, cut], k[:, cut], v[:, cut], log_alpha[:, cut], cross=cross, backend="torch")
        torch.testing.assert_close(o[:, t], full[:, t], rtol=0, atol=1e-12)


def test_decode_steps_equal_full_forward():
    """CS: one decode step per position == the whole sequence. CC: the source written one
    position per target step (a pass-through write, log alpha = 0, once it runs out).
    NC: the final state written once, then read by every query through pass-through steps."""
    n, m = 23, 15
    (q, k, v, log_alpha), state, _ = make_inputs(2, n, n, 2, 8, 8, 5, torch.float32, seed=9)
    full, full_final = gsa_attn(q, k, v, log_alpha, initial_state=state, output_final_state=True, backend="torch")
    memory, outputs = tuple(state), []
    for t in range(n):
        o, memory = gsa_decode_step(q[:, t], k[:, t], v[:, t], log_alpha[:, t], memory, backend="torch")
        outputs.append(o)
    assert_near(torch.stack(outputs, dim=1), full, 1e-5, "CS decode")
    for a, b in zip(memory, full_final):
        assert_near(a, b, 1e-5, "CS decode state")

    src = [x[:, :m] for x in (k, v, log_alpha)]
    pass_through = [torch.zeros_like(x[:, 0]) for x in src]
    for causal in (True, False):
        full, _ = gsa_attn(q, *src, causal=causal, cross=True, backend="torch")
        if causal:
            memory = tuple(torch.zeros_like(s) for s in state)
        else:
            _, memory = gsa_attn(q[:, :1], *src, causal=False, cross=True, output_final_state=True, backend="torch")
        outputs = []
        for t in range(n):
            write = [x[:, t] for x in src] if causal and t < m else pass_through
            o, memory = gsa_decode_step(q[:, t], *write, memory, backend="torch")
            outputs.append(o)
        assert_near(torch.stack(outputs, dim=1), full, 1e-5, "CC decode" if causal else "NC decode")


def test_decode_step_matches_reference_step():
    (q, k, v, log_alpha), state, _ = make_inputs(3, 1, 1, 2, 8, 5, 7, torch.float64, seed=10)
    o, new = gsa_decode_step(q[:, 0], k[:, 0], v[:, 0], log_alpha[:, 0], state, scale=0.3, backend="torch")
    o_ref, new_ref = reference_gsa_attn(q, k, v, log_alpha, initial_state=state, output_final_state=True, scale=0.3)
    torch.testing.assert_close(o, o_ref[:, 0])
    for a, b in zip(new, new_ref):
        torch.testing.assert_close(a, b)


def test_an_empty_source_leaves_the_state_and_cross_queries_read_it():
    (q, k, v, log_alpha), state, _ = make_inputs(2, 6, 0, 2, 8, 8, 5, torch.float64, seed=11)
    for causal in (True, False):
        o, final = gsa_attn(q, k, v, log_alpha, causal=causal, cross=True, initial_state=state,
                            output_final_state=True, backend="torch")
        o_ref, _ = reference_gsa_attn(q, k, v, log_alpha, causal=causal, cross=True, initial_state=state)
        torch.testing.assert_close(o, o_ref)
        assert all(torch.equal(a, b) for a, b in zip(final, state))
    for causal in (True, False):  # self-attention over nothing: no output, the state passes through
        o, final = gsa_attn(q[:, :0], k, v, log_alpha, causal=causal, initial_state=state, output_final_state=True,
                            backend="torch")
        assert o.shape == (2, 0, 2, 8) and all(torch.equal(a, b) for a, b in zip(final, state))
    o, final = gsa_attn(q[:1, :0], k[:1], v[:1], log_alpha[:1], cu_seqlens=torch.tensor([0, 0, 0]),
                        output_final_state=True, backend="torch")
    assert o.shape == (1, 0, 2, 8) and all(f.shape[0] == 2 and not f.any() for f in final)


# ---------------------------------------------------------------- arguments and dispatch


def test_chunk_size_does_not_change_results(monkeypatch):
    tensors, state, mask = make_inputs(1, 45, 45, 1, 8, 8, 5, torch.float64, seed=12)
    results = []
    for chunk in (1, 2, 16, 64):
        monkeypatch.setattr(torch_path, "CHUNK", chunk)
        results.append(gsa_attn(*tensors, initial_state=state, kv_mask=mask, backend="torch")[0])
    for r in results[1:]:
        torch.testing.assert_close(r, results[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("change,message", [
    (dict(k=torch.zeros(2, 9, 2, 4)), "inconsistent shapes"),
    (dict(q=torch.zeros(2, 8, 2, 8)), "same length"),
    (dict(v=torch.zeros(2, 9, 8)), "v must be"),
    (dict(kv_mask=torch.ones(2, 9)), "kv_mask"),
    (dict(cu_seqlens=torch.tensor([0, 9])), "batch 1"),
    (dict(cu_seqlens=torch.tensor([0, 9]), cross=True), "cross"),
    (dict(initial_state=(torch.zeros(2, 2, 5, 8),)), "initial_state"),
    (dict(initial_state=(torch.zeros(2, 2, 4, 8), torch.zeros(2, 2, 4, 8))), "initial_state K~"),
    (dict(scale=-1.0), "scale"),
    (dict(backend="cuda"), "backend"),
])
def test_bad_arguments_name_the_argument(change, message):
    (q, k, v, log_alpha), _, _ = make_inputs(2, 9, 9, 2, 8, 8, 5, torch.float32)
    args = dict(q=q, k=k, v=v, log_alpha=log_alpha)
    args.update(change)
    positional = [args.pop(name) for name in ("q", "k", "v", "log_alpha")]
    with pytest.raises(ValueError, match=message):
        gsa_attn(*positional, **args)


def test_bad_decode_state_names_the_argument():
    (q, k, v, log_alpha), state, _ = make_inputs(2, 1, 1, 2, 8, 8, 5, torch.float32)
    with pytest.raises(ValueError, match="state V~"):
        gsa_decode_step(q[:, 0], k[:, 0], v[:, 0], log_alpha[:, 0], (state[0], state[1][:, :, :3]))


def test_auto_backend_falls_back_when_triton_lacks_a_case(monkeypatch):
    fake = types.ModuleType("lavo_tasks.kernels.gsa.chunk")

    def chunk_gsa_attn(*args, **kwargs):
        raise NotImplementedError("pattern NS")

    fake.chunk_gsa_attn = chunk_gsa_attn
    monkeypatch.setitem(sys.modules, "lavo_tasks.kernels.gsa.chunk", fake)
    monkeypatch.setenv("LAVO_TASKS_BACKEND", "triton")
    tensors, _, _ = make_inputs(1, 9, 9, 1, 8, 8, 5, torch.float64)
    with pytest.warns(RuntimeWarning, match="pattern NS"):
        o, _ = gsa_attn(*tensors, causal=False)
    torch.testing.assert_close(o, gsa_attn(*tensors, causal=False, backend="torch")[0])
    with pytest.raises(NotImplementedError):
        gsa_attn(*tensors, causal=False, backend="triton")
