"""Time the LAVO Triton kernels on a GPU: per-kernel CUDA time and launch variants.

    python -m lavo_tasks.kernels.lavo.gpu_profile [--out FILE]

Protocol shape (bf16, H=16, d=64, w=128, r=64, 65,536 tokens per step): for T = 1K and
8K, forward and forward+backward medians (`triton.testing.do_bench`) for each
`NUM_WARPS[64]` variant, and one profiler table of the kernels of a forward+backward. The
whole benchmark against SDPA and FlexAttention is `python -m lavo_tasks.bench`.
"""

import argparse
import json

import torch
from triton.testing import do_bench

from . import chunk

HEADS, DIM, WINDOW, RANK, TOKENS = 16, 64, 128, 64, 65536
VARIANTS = [
    {"fwd": 4, "mem_bwd": 8, "dq": 8, "dkv": 8},
    {"fwd": 8, "mem_bwd": 8, "dq": 4, "dkv": 4},
    {"fwd": 4, "mem_bwd": 4, "dq": 4, "dkv": 4},
]


def inputs(T):
    B = TOKENS // T
    q, k, v = (torch.randn(B, T, HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    basis = torch.linalg.qr(torch.randn(HEADS, DIM, RANK, device="cuda"))[0].transpose(1, 2).contiguous()
    rel_bias = torch.zeros(HEADS, WINDOW, device="cuda")
    mem_bias = torch.zeros(HEADS, device="cuda")
    return [x.requires_grad_() for x in (q, k, v, basis, rel_bias, mem_bias)]


def time_variant(T, warps):
    chunk.NUM_WARPS[64].update(warps)
    leaves = inputs(T)
    fwd = lambda: chunk.chunk_lavo_attn(*leaves, window=WINDOW)  # noqa: E731

    def fwd_bwd():
        fwd().float().sum().backward()

    fwd_bwd()
    with torch.no_grad():
        fwd_ms = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    both_ms = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    return {"T": T, **{f"warps_{k}": v for k, v in warps.items()}, "fwd_ms": fwd_ms, "fwd_bwd_ms": both_ms}


def kernel_table(T):
    leaves = inputs(T)
    for _ in range(3):
        chunk.chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        chunk.chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="lavo_profile.jsonl")
    args = parser.parse_args()
    default = dict(chunk.NUM_WARPS[64])
    rows = []
    with open(args.out, "w") as f:
        for T in (1024, 8192):
            for warps in VARIANTS:
                row = time_variant(T, warps)
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    chunk.NUM_WARPS[64].update(default)
    print(kernel_table(4096))


if __name__ == "__main__":
    main()
