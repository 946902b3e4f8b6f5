"""LAVO kernels' launch settings at task shapes on a GPU (chunk.LAUNCH's head dim 128 entry).

    python benchmarks/lavo_launch_sweep.py

`lavo_gpu_profile.py --variants` times the protocol shape (16 heads of 64); this times the
shapes of tts's cab preset (4 heads of 128, batch 16, window 32, rank 16: CS over 512, CC
512 over 128, NS over 128) and a tsf-like head dim 64 (4 heads, batch 32, CS over 96).
Each variant sets dkv's whole launch (for every head dim alike: both "dkv" entries of
chunk.LAUNCH), or one option of the forward or memory backward. Per shape and variant: the
forward+backward median (eager, so mostly host time at these sizes), each LAVO kernel's
CUDA µs per call (profiler, 5 calls), and the largest relative RMS error of the output
and gradients against the fp32 PyTorch path (WRONG above 5e-3). Last, the registers and
spills of every kernel compiled, pooled.
"""

import collections
import contextlib
import copy

import torch
from triton.testing import do_bench

from lavo_tasks.kernels.lavo import chunk, chunk_bwd, chunk_fwd
from lavo_tasks.kernels.lavo.chunk import chunk_lavo_attn
from lavo_tasks.kernels.lavo.torch_path import torch_lavo_attn

CHECK_TOL = 5e-3
DKV = dict(num_warps=4, num_stages=2)
VARIANTS = {  # name: {LAUNCH entry: settings}; "dkv" sets both dkv entries
    "dkv_split2": {"dkv": {**DKV, "SPLIT": 2}},
    "dkv_split4": {"dkv": {**DKV, "SPLIT": 4}},
    "dkv_split2_stages1": {"dkv": {**DKV, "SPLIT": 2, "num_stages": 1}},
    "dkv_w8_split2": {"dkv": {**DKV, "SPLIT": 2, "num_warps": 8}},
    "dkv_w8_split4": {"dkv": {**DKV, "SPLIT": 4, "num_warps": 8}},
    "dkv_w8_split1": {"dkv": {**DKV, "SPLIT": 1, "num_warps": 8}},
    "fwd_w8": {"fwd": {"num_warps": 8, "num_stages": 2}},
    "mem_bwd_w8": {"mem_bwd": {"num_warps": 8, "num_stages": 2}},
}
SHAPES = {  # name: batch, heads, head dim, queries, keys, causal, cross, window, rank
    "d128 CS 512": (16, 4, 128, 512, 512, True, False, 32, 16),
    "d128 CC 512 over 128": (16, 4, 128, 512, 128, True, True, 32, 16),
    "d128 NS 128": (16, 4, 128, 128, 128, False, False, 32, 16),
    "d64 CS 96": (32, 4, 64, 96, 96, True, False, 32, 16),
}


@contextlib.contextmanager
def launch_settings(variant):
    saved = copy.deepcopy(chunk.LAUNCH)
    try:
        for entry, settings in variant.items():
            for key in ("dkv", "dkv_d128") if entry == "dkv" else (entry,):
                chunk.LAUNCH[key] = dict(settings)
        yield
    finally:
        chunk.LAUNCH.clear()
        chunk.LAUNCH.update(saved)


def leaves(batch, heads, dim, n, m, causal, window, rank):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, n, heads, dim, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(batch, m, heads, dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    basis = torch.linalg.qr(torch.randn(heads, dim, rank, device="cuda", generator=g))[0].transpose(1, 2).contiguous()
    rel_bias = 0.5 * torch.randn(heads, window + (not causal), device="cuda", generator=g)  # NS: offsets -w/2..w/2
    return [q, k, v, basis, rel_bias, torch.randn(heads, device="cuda", generator=g)]


def outputs_and_grads(run, inputs, grad_out):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = run(*inputs)
    out.backward(grad_out.to(out.dtype))
    return [out.detach().double()] + [x.grad.double() for x in inputs]


def registers():
    """{kernel: {(num_warps, registers, spills)}} over every compiled version."""
    found = collections.defaultdict(set)
    for name, fn in (("fwd", chunk_fwd.lavo_fwd_kernel), ("mem_bwd", chunk_bwd.lavo_mem_bwd_kernel),
                     ("dkv", chunk_bwd.lavo_dkv_kernel)):
        for cache in fn.device_caches.values():
            for kernel in cache[0].values():
                found[name].add((kernel.metadata.num_warps, kernel.n_regs, kernel.n_spills))
    return dict(found)


def main():
    for shape, (batch, heads, dim, n, m, causal, cross, window, rank) in SHAPES.items():
        options = dict(window=window, causal=causal, cross=cross, segments=1, scale=None, kv_mask=None, cu_seqlens=None)
        inputs = leaves(batch, heads, dim, n, m, causal, window, rank)
        grad_out = torch.randn(batch, n, heads, dim, device="cuda").bfloat16().float()
        want = outputs_and_grads(lambda *xs: torch_lavo_attn(*xs, **options), [x.float() for x in inputs], grad_out)
        for name, variant in VARIANTS.items():
            with launch_settings(variant):
                run = lambda *xs: chunk_lavo_attn(*xs, **options)  # noqa: E731
                got = outputs_and_grads(run, inputs, grad_out)
                error = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, want))
                xs = [x.detach().clone().requires_grad_() for x in inputs]

                def fwd_bwd():
                    run(*xs).float().sum().backward()

                fwd_bwd()
                ms = do_bench(fwd_bwd, warmup=10, rep=50, grad_to_none=xs, return_mode="median")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fwd_bwd()
                    torch.cuda.synchronize()
            per_call = collections.defaultdict(float)
            for event in prof.key_averages():
                if event.key.startswith("lavo_"):
                    per_call[event.key.removeprefix("lavo_").removesuffix("_kernel")] += event.self_device_time_total / 5
            kernels = " ".join(f"{k} {v:.1f}" for k, v in sorted(per_call.items()))
            flag = "" if error <= CHECK_TOL else " WRONG"
            print(f"{shape:22s} {name:20s} f+b {ms * 1e3:7.1f} us  error {error:.1e}{flag}  {kernels}", flush=True)
    print("registers (num_warps, registers, spills):", registers())


if __name__ == "__main__":
    main()
