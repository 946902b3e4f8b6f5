"""The LAVO or GSA kernels' launch settings at task shapes on a GPU.

    python benchmarks/launch_sweep.py --family lavo|gsa [--variants NAME,...] [--shapes NAME,...]

`lavo_gpu_profile.py --variants` times the protocol shape (16 heads of 64); this times the
shapes of tts's cab preset (4 heads of 128, batch 16: CS over 512, CC and NC 512 over 128,
NS over 128), a tsf-like head dim 64 (4 heads, batch 32, CS over 96) and tsf's cab preset
(8 heads of 64, batch 32: NS over 96, NC 72 over 96) and pcc's (6 heads of 64, batch 32:
NS over the 128 proxies and the 224 queries, NC 224 over 128); LAVO with window 32
and rank 16, GSA with 64 slots (the attention configs' defaults). Each variant sets
module-level launch settings: for LAVO an entry of kernels/lavo/chunk.py's LAUNCH (a dkv
variant sets both dkv entries, so it means the same launch at every head dim), for GSA
kernels/gsa/chunk.py's WHOLE_WARPS and WHOLE_WARPS_WIDE (a variant sets both, so it
means the same warps at every head dim), WHOLE_BC, NS_ONE_SCAN_PROGRAMS or CROSS_ONE_SCAN_ROWS ("shipped" sets
nothing). Per shape and variant: the forward+backward median (eager, so mostly host time at these sizes), the CUDA µs per
call of all its kernels and of each Triton kernel (profiler, 5 calls), and the largest relative RMS error of the output and
gradients against the fp32 PyTorch path (WRONG above 5e-3). For LAVO last, the registers and
spills of every kernel compiled, pooled.
"""

import argparse
import collections
import contextlib
from unittest import mock

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from lavo_tasks.kernels import gsa_attn, lavo_attn
from lavo_tasks.kernels.gsa import chunk as gsa_chunk
from lavo_tasks.kernels.lavo import chunk as lavo_chunk
from lavo_tasks.kernels.lavo import chunk_bwd, chunk_fwd

from lavo_gpu_profile import outputs_and_grads  # benchmarks/, the script's own folder

CHECK_TOL = 5e-3
WINDOW, RANK, SLOTS = 32, 16, 64
DKV = dict(num_warps=4, num_stages=2)
WHOLE = lambda **warps: {"output": 4, "query": 4, "key": 4, **warps}  # noqa: E731


def whole_warps(**warps):
    """A GSA variant with these whole-chunk warps at every head dim (both WHOLE_WARPS tables)."""
    return {(gsa_chunk, name, None): WHOLE(**warps) for name in ("WHOLE_WARPS", "WHOLE_WARPS_WIDE")}


VARIANTS = {  # family: {name: {(module, global, key or None): value}}
    "lavo": {
        "dkv_split2": {(lavo_chunk, "LAUNCH", k): {**DKV, "SPLIT": 2} for k in ("dkv", "dkv_d128")},
        "dkv_split4": {(lavo_chunk, "LAUNCH", k): {**DKV, "SPLIT": 4} for k in ("dkv", "dkv_d128")},
        "dkv_split2_stages1": {(lavo_chunk, "LAUNCH", k): {**DKV, "SPLIT": 2, "num_stages": 1}
                               for k in ("dkv", "dkv_d128")},
        "dkv_w8_split2": {(lavo_chunk, "LAUNCH", k): {**DKV, "SPLIT": 2, "num_warps": 8} for k in ("dkv", "dkv_d128")},
        "dkv_w8_split4": {(lavo_chunk, "LAUNCH", k): {**DKV, "SPLIT": 4, "num_warps": 8} for k in ("dkv", "dkv_d128")},
        "fwd_w8": {(lavo_chunk, "LAUNCH", "fwd"): {"num_warps": 8, "num_stages": 2}},
        "mem_bwd_w8": {(lavo_chunk, "LAUNCH", "mem_bwd"): {"num_warps": 8, "num_stages": 2}},
    },
    "gsa": {
        "shipped": {},
        "ns_two_scans": {(gsa_chunk, "NS_ONE_SCAN_PROGRAMS", None): 0},
        "ns_one_scan": {(gsa_chunk, "NS_ONE_SCAN_PROGRAMS", None): 10**9},
        # CC's longer targets and NC read the final source state in PyTorch (their compiled form)
        "cross_read": {(gsa_chunk, "CROSS_ONE_SCAN_ROWS", None): 0},
        "cross_one_scan": {(gsa_chunk, "CROSS_ONE_SCAN_ROWS", None): 10**9},
        "whole_w4": whole_warps(),
        "whole_w8": whole_warps(output=8, query=8, key=8),
        "whole_key_w8": whole_warps(key=8),
        "whole_query_w8": whole_warps(query=8),
        "whole_output_w8": whole_warps(output=8),
        "whole_bc32": {(gsa_chunk, "WHOLE_BC", None): 32, **whole_warps()},
        "whole_bc32_w8": {(gsa_chunk, "WHOLE_BC", None): 32, **whole_warps(output=8, query=8, key=8)},
    },
}
SHAPES = {  # name: batch, heads, head dim, queries, keys, causal, cross
    "d128 CS 512": (16, 4, 128, 512, 512, True, False),
    "d128 CC 512 over 128": (16, 4, 128, 512, 128, True, True),
    "d128 NS 128": (16, 4, 128, 128, 128, False, False),
    "d64 CS 96": (32, 4, 64, 96, 96, True, False),
    "tsf NS 96": (32, 8, 64, 96, 96, False, False),  # tsf's cab preset: 8 heads of 64
    "tsf NC 72 over 96": (32, 8, 64, 72, 96, False, True),
    "d128 NC 512 over 128": (16, 4, 128, 512, 128, False, True),
    # pcc's cab preset (6 heads of 64, batch 32): the encoder's 128 proxies, the 224 queries
    "pcc NS 128": (32, 6, 64, 128, 128, False, False),
    "pcc NS 224": (32, 6, 64, 224, 224, False, False),
    "pcc NC 224 over 128": (32, 6, 64, 224, 128, False, True),
}


def patched(variant) -> contextlib.ExitStack:
    """The module globals of `variant` set (a dict entry where the key names one), restored
    on exit."""
    stack = contextlib.ExitStack()
    for (module, name, key), value in variant.items():
        if key is None:
            stack.enter_context(mock.patch.object(module, name, value))
        else:
            stack.enter_context(mock.patch.dict(getattr(module, name), {key: value}))
    return stack


def inputs(family, batch, heads, dim, n, m, causal):
    """bf16 q, k, v and the family's fp32 parameters: LAVO's basis and biases, GSA's gates."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, n, heads, dim, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(batch, m, heads, dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    if family == "gsa":  # log alpha = logsigmoid(f) / tau, tau = 8, as the GSA layer makes them
        return [q, k, v, F.logsigmoid(torch.randn(batch, m, heads, SLOTS, device="cuda", generator=g)) / 8]
    basis = torch.linalg.qr(torch.randn(heads, dim, RANK, device="cuda", generator=g))[0].transpose(1, 2).contiguous()
    rel_bias = 0.5 * torch.randn(heads, WINDOW + (not causal), device="cuda", generator=g)  # NS: offsets -w/2..w/2
    return [q, k, v, basis, rel_bias, torch.randn(heads, device="cuda", generator=g)]


def attention(family, causal, cross, backend):
    if family == "gsa":
        return lambda *xs: gsa_attn(*xs, causal=causal, cross=cross, backend=backend)[0]
    return lambda *xs: lavo_attn(*xs, window=WINDOW, causal=causal, cross=cross, backend=backend)


def lavo_registers():
    """{kernel: {(num_warps, registers, spills)}} over every compiled version."""
    found = collections.defaultdict(set)
    for name, fn in (("fwd", chunk_fwd.lavo_fwd_kernel), ("mem_bwd", chunk_bwd.lavo_mem_bwd_kernel),
                     ("dkv", chunk_bwd.lavo_dkv_kernel)):
        for cache in fn.device_caches.values():
            for kernel in cache[0].values():
                found[name].add((kernel.metadata.num_warps, kernel.n_regs, kernel.n_spills))
    return dict(found)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=list(VARIANTS), required=True)
    parser.add_argument("--variants", help="comma-separated names of the family's variants (default: all)")
    parser.add_argument("--shapes", help="comma-separated prefixes of SHAPES' names, e.g. 'd128 NS' (default: all)")
    args = parser.parse_args()
    family = args.family
    variants = VARIANTS[family]
    if args.variants:
        names = [name.strip() for name in args.variants.split(",")]
        unknown = set(names) - set(variants)
        if unknown:
            parser.error(f"--variants: unknown {sorted(unknown)}; {family} has {sorted(variants)}")
        variants = {name: variants[name] for name in names}
    shapes = SHAPES
    if args.shapes:
        prefixes = [prefix.strip() for prefix in args.shapes.split(",")]
        shapes = {name: shape for name, shape in SHAPES.items() if name.startswith(tuple(prefixes))}
        if not shapes:
            parser.error(f"--shapes: no shape starts with any of {prefixes}; the shapes are {list(SHAPES)}")
    for shape, (batch, heads, dim, n, m, causal, cross) in shapes.items():
        leaves = inputs(family, batch, heads, dim, n, m, causal)
        grad_out = torch.randn(batch, n, heads, dim, device="cuda").bfloat16().float()
        reference = attention(family, causal, cross, "torch")
        want = outputs_and_grads(reference, [x.float() for x in leaves], grad_out)
        run = attention(family, causal, cross, "triton")
        for name, variant in variants.items():
            with patched(variant):
                got = outputs_and_grads(run, leaves, grad_out)
                error = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, want))
                xs = [x.detach().clone().requires_grad_() for x in leaves]

                def fwd_bwd():
                    run(*xs).float().sum().backward()

                fwd_bwd()
                ms = do_bench(fwd_bwd, warmup=10, rep=50, grad_to_none=xs, return_mode="median")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fwd_bwd()
                    torch.cuda.synchronize()
            per_call = collections.defaultdict(float)
            gpu = sum(event.self_device_time_total for event in prof.key_averages()) / 5
            for event in prof.key_averages():
                if event.key.endswith("_kernel") and not event.key.startswith("triton_"):
                    per_call[event.key.removesuffix("_kernel").lstrip("_")] += event.self_device_time_total / 5
            kernels = " ".join(f"{k} {v:.1f}" for k, v in sorted(per_call.items()))
            flag = "" if error <= CHECK_TOL else " WRONG"
            print(f"{shape:22s} {name:20s} f+b {ms * 1e3:7.1f} us  gpu {gpu:7.1f} us  error {error:.1e}{flag}  {kernels}", flush=True)
    if family == "lavo":
        print("registers (num_warps, registers, spills):", lavo_registers())


if __name__ == "__main__":
    main()
