"""GSA Triton kernels on a GPU at realistic shapes (marker `gpu`; run on the device machine).

bf16 kernels against the fp32 PyTorch path on the same (bf16-rounded) inputs: relative
RMS error <= 5e-3 on outputs, final states and every gradient (docs/design.md §2.5).
"""

import pytest
import torch
import torch.nn.functional as F

from lavo_tasks.kernels import gsa_attn, gsa_decode_step
from lavo_tasks.kernels.gsa import chunk
from compare import rms_rel_error

pytestmark = pytest.mark.gpu
TOL = 5e-3


def _inputs(batch, n, m, heads, dk, dv, slots, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, n, heads, dk, device="cuda", generator=g)
    k = torch.randn(batch, m, heads, dk, device="cuda", generator=g)
    v = torch.randn(batch, m, heads, dv, device="cuda", generator=g)
    la = F.logsigmoid(torch.randn(batch, m, heads, slots, device="cuda", generator=g) * 2) / 4
    return [x.to(torch.bfloat16) for x in (q, k, v, la)]


def _run(backend, xs, states, dtype=None, **kw):
    """o, final state and gradients of a random projection of both."""
    dtype = dtype or (torch.bfloat16 if backend == "triton" else torch.float32)
    xs = [x.to(dtype).detach().requires_grad_() for x in xs]
    states = None if states is None else [s.detach().clone().requires_grad_() for s in states]
    o, final = gsa_attn(*xs, initial_state=states, output_final_state=True, backend=backend, **kw)
    g = torch.Generator(device="cuda").manual_seed(1)
    loss = (o.float() * torch.randn(o.shape, device="cuda", generator=g)).sum()
    loss = loss + sum((s * torch.randn(s.shape, device="cuda", generator=g)).sum() for s in final)
    loss.backward()
    grads = [x.grad for x in xs] + ([] if states is None else [s.grad for s in states])
    return [o, *final, *grads]


def _compare(xs, states=None, dtype=torch.bfloat16, tol=TOL, **kw):
    names = ["o", "K~_T", "V~_T", "dq", "dk", "dv", "dlog_alpha", "dK~_0", "dV~_0"]
    fast = _run("triton", xs, states, dtype, **kw)
    ref = _run("torch", xs, states, **kw)
    errors = {n: rms_rel_error(a, b) for n, a, b in zip(names, fast, ref)}
    assert all(e <= tol for e in errors.values()), " ".join(f"{n}={e:.1e}" for n, e in errors.items())


@pytest.mark.parametrize("length,dim", [(8192, 64), (4096, 128), (1000, 64)])
def test_causal_bf16_matches_fp32_torch_path(length, dim):
    xs = _inputs(2, length, length, 4, dim, dim, 64)
    states = [torch.randn(2, 4, 64, dim, device="cuda") * 0.5 for _ in range(2)]
    _compare(xs, states)


def test_causal_fp32_matches_fp32_torch_path():
    """fp32 inputs run fp32 ("ieee") dots: near-fp32 agreement at 8K."""
    xs = _inputs(1, 8192, 8192, 2, 64, 64, 64)
    states = [torch.randn(1, 2, 64, 64, device="cuda") * 0.5 for _ in range(2)]
    _compare(xs, states, dtype=torch.float32, tol=1e-4)


@pytest.mark.parametrize("causal,cross,n,m", [(False, False, 1500, 1500), (True, True, 700, 1300),
                                              (True, True, 1300, 700), (False, True, 900, 1100)])
def test_patterns_bf16(causal, cross, n, m):
    xs = _inputs(2, n, m, 2, 64, 64, 64, seed=3)
    mask = torch.ones(2, m, dtype=torch.bool, device="cuda")
    mask[1, m - 200:] = False
    _compare(xs, causal=causal, cross=cross, kv_mask=mask)


@pytest.mark.parametrize("one_scan_programs", [10**9, 0], ids=["one scan", "two scans"])
def test_noncausal_self_in_both_forms_bf16(monkeypatch, one_scan_programs):
    """NS's two directions as one scan and as two (the form above NS_ONE_SCAN_PROGRAMS),
    at tts's head dim of 128 (8-warp whole-chunk kernels), padded and with states."""
    monkeypatch.setattr(chunk, "NS_ONE_SCAN_PROGRAMS", one_scan_programs)
    xs = _inputs(3, 300, 300, 4, 128, 128, 64, seed=5)
    mask = torch.ones(3, 300, dtype=torch.bool, device="cuda")
    mask[2, 250:] = False
    states = [torch.randn(3, 4, 64, 128, device="cuda") * 0.5 for _ in range(2)]
    _compare(xs, states, causal=False, kv_mask=mask)


def test_varlen_bf16():
    cu = torch.tensor([0, 1000, 1077, 3000, 4096], device="cuda")
    xs = _inputs(1, 4096, 4096, 2, 64, 64, 64, seed=5)
    states = [torch.randn(4, 2, 64, 64, device="cuda") * 0.5 for _ in range(2)]
    _compare(xs, states, cu_seqlens=cu)


@pytest.mark.parametrize("dk,dv,slots", [(100, 72, 80), (256, 200, 256)])
def test_odd_and_large_sizes(dk, dv, slots):
    """Padded sizes and the largest (head dims in column blocks, 256 slots)."""
    xs = _inputs(1, 600, 600, 2, dk, dv, slots, seed=7)
    _compare(xs)


def test_128k_forward_backward_runs_and_is_causal():
    q, k, v, la = (x.requires_grad_() for x in _inputs(1, 131072, 131072, 16, 64, 64, 64, seed=9))
    o, _ = gsa_attn(q, k, v, la, backend="triton")
    o.float().square().mean().backward()
    assert torch.isfinite(o).all() and all(torch.isfinite(x.grad).all() for x in (q, k, v, la))
    prefix, _ = gsa_attn(q[:, :4096], k[:, :4096], v[:, :4096], la[:, :4096], backend="triton")
    assert rms_rel_error(o[:, :4096], prefix) <= 1e-6


def test_decode_steps_match_full_forward():
    q, k, v, la = _inputs(8, 96, 96, 16, 64, 64, 64, seed=11)
    full, final = gsa_attn(q, k, v, la, output_final_state=True, backend="torch")
    state = (torch.zeros(8, 16, 64, 64, device="cuda"), torch.zeros(8, 16, 64, 64, device="cuda"))
    steps = []
    for t in range(96):
        o, state = gsa_decode_step(q[:, t], k[:, t], v[:, t], la[:, t], state, backend="triton")
        steps.append(o)
    assert rms_rel_error(torch.stack(steps, 1), full) <= TOL
    assert rms_rel_error(state[0], final[0]) <= 1e-5 and rms_rel_error(state[1], final[1]) <= 1e-5
