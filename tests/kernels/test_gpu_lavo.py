"""LAVO Triton kernels compiled on a CUDA GPU (marker `gpu`; run through the device tool:
`python3 -m pytest -m gpu tests/kernels/test_gpu_lavo.py`).

- fp32 inputs against the PyTorch path in float64 (max error <= 1e-4 of the max abs):
  the compiled kernels (ieee fp32 dots, the gather that sums bias diagonals, atomics)
  compute the same function as under the interpreter, for every pattern they support.
- bf16 inputs against the PyTorch path in fp32 at the protocol's shape up to T = 8K,
  and at head dim 256 with rank 256: relative RMS
  error <= 5e-3 on the output and every gradient (docs/design.md §2.5).
- B=1, T=128K: forward and backward run and give finite results.
"""

import pytest
import torch

from lavo_tasks.kernels.lavo.chunk import chunk_lavo_attn
from lavo_tasks.kernels.lavo.torch_path import torch_lavo_attn
from compare import max_rel_error, rms_rel_error

pytestmark = pytest.mark.gpu
GRAD_NAMES = ("q", "k", "v", "basis", "rel_bias", "mem_bias")


def make_inputs(batch, n, m, heads, dim, rank, window, causal, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, device="cuda")  # noqa: E731
    q, k, v = randn(batch, n, heads, dim), randn(batch, m, heads, dim), randn(batch, m, heads, dim)
    basis = torch.linalg.qr(randn(heads, dim, rank).double())[0].transpose(1, 2).float().contiguous()
    rel_bias = 0.5 * randn(heads, window if causal else window + 1)
    mem_bias = 0.5 * randn(heads)
    return [x.to(dtype) for x in (q, k, v)] + [basis, rel_bias, mem_bias]


def outputs_and_grads(run, inputs, ref_dtype, grad_out, **options):
    leaves = [x.detach().clone().to(ref_dtype or x.dtype).requires_grad_() for x in inputs]
    out = run(*leaves, **options)
    out.backward(grad_out.to(out.dtype))
    return [out] + [x.grad for x in leaves]


def compare(inputs, *, ref_dtype, metric, tol, **options):
    options = {"segments": 1, "scale": None, "kv_mask": None, "cu_seqlens": None, **options}
    grad_out = torch.randn(inputs[0].shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    got = outputs_and_grads(chunk_lavo_attn, inputs, None, grad_out, **options)
    want = outputs_and_grads(torch_lavo_attn, inputs, ref_dtype, grad_out, **options)
    errors = {}
    for name, a, b in zip(("output",) + tuple(f"d{x}" for x in GRAD_NAMES), got, want):
        a, b = a.double(), b.double()
        assert torch.isfinite(a).all(), name
        errors[name] = metric(a, b)
    print(errors)
    assert all(err <= tol for err in errors.values()), errors


@pytest.mark.parametrize(
    "pattern, n, m, window, masked, packed",
    [("CS", 300, 300, 128, False, False), ("CS", 333, 333, 70, True, True), ("NS", 260, 260, 64, True, False),
     ("CC", 400, 150, 32, True, False), ("CC", 100, 257, 128, False, False)],
)
def test_fp32_matches_torch_path_in_float64(pattern, n, m, window, masked, packed):
    causal, cross = pattern != "NS", pattern == "CC"
    batch = 1 if packed else 2
    inputs = make_inputs(batch, n, m, 3, 48, 20, window, causal, torch.float32, seed=n)
    mask = torch.rand(batch, m, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)) > 0.2
    cu = torch.tensor([0, 100, 101, 260, n], device="cuda", dtype=torch.int32) if packed else None
    compare(inputs, ref_dtype=torch.float64, metric=max_rel_error, tol=1e-4, window=window, causal=causal, cross=cross,
            kv_mask=mask if masked else None, cu_seqlens=cu)


def test_fp32_noncausal_cross_segments_match_torch_path_in_float64():
    q, k, v, basis, _, _ = make_inputs(2, 300, 200, 3, 48, 20, 4, False, torch.float32, seed=4)
    mem_bias = torch.randn(3, 3, device="cuda")
    mask = torch.rand(2, 200, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2)) > 0.2
    options = {"window": 4, "causal": False, "cross": True, "segments": 3, "scale": None, "kv_mask": mask,
               "cu_seqlens": None}
    grad_out = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(8))
    leaves = [q, v, basis, mem_bias]
    ours = lambda q, v, b, mu: chunk_lavo_attn(q, k, v, b, None, mu, **options)  # noqa: E731
    torch_path = lambda q, v, b, mu: torch_lavo_attn(q, k.double(), v, b, None, mu, **options)  # noqa: E731
    got = outputs_and_grads(ours, leaves, None, grad_out)
    want = outputs_and_grads(torch_path, leaves, torch.float64, grad_out)
    names = ("output", "dq", "dv", "dbasis", "dmem_bias")
    errors = {name: max_rel_error(a.double(), b.double()) for name, a, b in zip(names, got, want)}
    print(errors)
    assert all(err <= 1e-4 for err in errors.values()), errors


@pytest.mark.parametrize("batch, n", [(4, 1024), (1, 8192)])
def test_bf16_matches_fp32_torch_path(batch, n):
    inputs = make_inputs(batch, n, n, 16, 64, 64, 128, True, torch.bfloat16, seed=n)
    compare(inputs, ref_dtype=torch.float32, metric=rms_rel_error, tol=5e-3, window=128, causal=True, cross=False)


def test_bf16_noncausal_self_and_odd_head_dim():
    inputs = make_inputs(2, 3000, 3000, 4, 96, 80, 256, False, torch.bfloat16, seed=3)
    compare(inputs, ref_dtype=torch.float32, metric=rms_rel_error, tol=5e-3, window=256, causal=False, cross=False)


def test_bf16_head_dim_256_full_rank():
    # chunks of 32, four rank blocks of 64 (atomic sums in the memory backward); causal
    # only, to keep the compiles few (the noncausal paths are the same code at d = 96)
    window = 128
    inputs = make_inputs(2, 700, 700, 2, 256, 256, window, True, torch.bfloat16, seed=256)
    compare(inputs, ref_dtype=torch.float32, metric=rms_rel_error, tol=5e-3, window=window, causal=True, cross=False)


def test_128k_forward_backward_runs():
    n = 131072
    q, k, v, basis, rel_bias, mem_bias = make_inputs(1, n, n, 16, 64, 64, 128, True, torch.bfloat16, seed=0)
    leaves = [x.requires_grad_() for x in (q, k, v, basis, rel_bias, mem_bias)]
    torch.cuda.reset_peak_memory_stats()
    out = chunk_lavo_attn(*leaves, window=128)
    out.float().sum().backward()
    torch.cuda.synchronize()
    print(f"T=128K fwd+bwd peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_decode_step_bf16_matches_torch_step_and_latency():
    # batch 8 at a 128K context: the state (ring of w-1 keys/values, fp32 sum, count) is
    # the same size at any context, so a state that claims 131072 seen tokens is enough
    from triton.testing import do_bench

    from lavo_tasks.kernels import LavoDecodeState, lavo_decode_step
    from lavo_tasks.kernels.lavo.recurrent import recurrent_lavo_step

    batch, heads, dim, rank, window, context = 8, 16, 64, 64, 128, 131072
    g = torch.Generator(device="cuda").manual_seed(5)
    state = LavoDecodeState.empty(batch, heads, dim, rank, window, dtype=torch.bfloat16, device="cuda")
    state.keys.normal_(generator=g)
    state.values.normal_(generator=g)
    state.mem_sum.normal_(generator=g).mul_(context**0.5)
    state = state._replace(count=context)
    q, k, v = (torch.randn(batch, heads, dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    _, _, _, basis, rel_bias, mem_bias = make_inputs(1, 1, 1, heads, dim, rank, window, True, torch.bfloat16, seed=9)
    got, new = recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, window=window)
    want, twin = lavo_decode_step(q, k, v, basis, rel_bias, mem_bias, state, window=window, backend="torch")
    assert rms_rel_error(got.double(), want.double()) <= 5e-3
    assert torch.equal(new.keys, twin.keys) and torch.equal(new.values, twin.values)
    ms = do_bench(lambda: recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, window=window),
                  warmup=25, rep=100, return_mode="median")
    state_mib = sum(x.numel() * x.element_size() for x in (state.keys, state.values, state.mem_sum)) / 2**20
    print(f"decode batch {batch}, context {context}: {ms:.4f} ms per token, state {state_mib:.2f} MiB")
    assert ms <= 0.1


@pytest.mark.parametrize("count", [3, 200])
def test_decode_step_takes_the_count_on_the_device(count):
    """The Triton step with state.count a 0-dim tensor (what a captured decode passes) gives
    the output and the new state of the same step with count an int, bit for bit, before
    the ring is full (count 3 < w - 1) and after (200)."""
    from lavo_tasks.kernels import LavoDecodeState
    from lavo_tasks.kernels.lavo.recurrent import recurrent_lavo_step

    batch, heads, dim, rank, window = 3, 4, 64, 32, 128
    g = torch.Generator(device="cuda").manual_seed(11)
    state = LavoDecodeState.empty(batch, heads, dim, rank, window, dtype=torch.bfloat16, device="cuda")
    state.keys.normal_(generator=g)
    state.values.normal_(generator=g)
    state.mem_sum.normal_(generator=g)
    q, k, v = (torch.randn(batch, heads, dim, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    _, _, _, basis, rel_bias, mem_bias = make_inputs(1, 1, 1, heads, dim, rank, window, True, torch.bfloat16, seed=3)
    want, after = recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state._replace(count=count), window=window)
    on_device = state._replace(count=torch.tensor(count, device="cuda"))
    got, new = recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, on_device, window=window)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(new[:3], after[:3]))
    assert isinstance(new.count, torch.Tensor) and int(new.count) == count + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_decode_step_matches_torch_path(dtype):
    """The compiled CC cross-attention step (one target position against a prepared
    source of 4,096 positions, the last 100 padded in row 1): the PyTorch path's output,
    max error <= 1e-4 (fp32) or 1e-2 (bf16) of the max abs, at positions in the first
    window, inside the source and past its end; the position as a 0-dim tensor gives the
    same output."""
    from lavo_tasks.kernels.lavo.cross_step import cross_lavo_step
    from lavo_tasks.kernels.lavo.decode import lavo_source
    from lavo_tasks.kernels.lavo.torch_path import torch_lavo_cross_decode

    batch, m, heads, dim, rank, window = 2, 4096, 8, 64, 64, 128
    q, k, v, basis, rel_bias, mem_bias = make_inputs(batch, 1, m, heads, dim, rank, window, True, dtype, seed=2)
    mask = torch.ones(batch, m, dtype=torch.bool, device="cuda")
    mask[1, m - 100 :] = False
    source = lavo_source(k, v, basis, causal=True, kv_mask=mask)
    for position in (0, 70, 1000, 4095, 5000):
        want = torch_lavo_cross_decode(q, source, basis, rel_bias, mem_bias, window=window, start=position, scale=None)
        got = cross_lavo_step(q, source, basis, rel_bias, mem_bias, window=window, start=position)
        assert max_rel_error(got.double(), want.double()) <= (1e-4 if dtype == torch.float32 else 1e-2), position
        on_device = cross_lavo_step(q, source, basis, rel_bias, mem_bias, window=window,
                                    start=torch.tensor(position, device="cuda"))
        assert torch.equal(on_device, got)
