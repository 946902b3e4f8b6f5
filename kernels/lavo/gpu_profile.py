"""Time the LAVO Triton kernels on a GPU: medians and per-kernel CUDA time.

    python -m lavo_tasks.kernels.lavo.gpu_profile [--out FILE]

Protocol shape (bf16, H=16, d=64, w=128, r=64, 65,536 tokens per step): forward and
forward+backward medians (`triton.testing.do_bench`) at T = 1K and 8K; one profiler
table of the kernels of a forward+backward at 4K (gradients reset first, so the table
holds no gradient accumulation); then, if the rest took under WIDE_AFTER_S seconds, the
medians at head dim 256, rank 256, T = 4K. JSON lines go to FILE as they come; the whole
benchmark against SDPA and FlexAttention is `python -m lavo_tasks.bench`.
"""

import argparse
import json
import time

import torch
from triton.testing import do_bench

from .chunk import chunk_lavo_attn

HEADS, DIM, WINDOW, RANK, TOKENS = 16, 64, 128, 64, 65536
WIDE_AFTER_S = 75  # the d = 256 medians (more kernels to compile) run only if the rest took less


def inputs(T, dim=DIM, rank=RANK):
    B = TOKENS // T
    q, k, v = (torch.randn(B, T, HEADS, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    basis = torch.linalg.qr(torch.randn(HEADS, dim, rank, device="cuda"))[0].transpose(1, 2).contiguous()
    rel_bias = torch.zeros(HEADS, WINDOW, device="cuda")
    mem_bias = torch.zeros(HEADS, device="cuda")
    return [x.requires_grad_() for x in (q, k, v, basis, rel_bias, mem_bias)]


def medians(T, dim=DIM, rank=RANK):
    """fwd and fwd+bwd medians (ms)."""
    leaves = inputs(T, dim, rank)
    fwd = lambda: chunk_lavo_attn(*leaves, window=WINDOW)  # noqa: E731

    def fwd_bwd():
        fwd().float().sum().backward()

    fwd_bwd()  # compiles
    with torch.no_grad():
        fwd_ms = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    both_ms = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    return {"T": T, "dim": dim, "rank": rank, "fwd_ms": fwd_ms, "fwd_bwd_ms": both_ms}


def kernel_table(T):
    leaves = inputs(T)
    for _ in range(3):
        chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
    for x in leaves:
        x.grad = None
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="lavo_profile.jsonl")
    args = parser.parse_args()
    started = time.monotonic()
    with open(args.out, "w") as f:

        def emit(row):
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)

        for T in (1024, 8192):
            emit(medians(T))
        print(kernel_table(4096), flush=True)
        elapsed = time.monotonic() - started
        if elapsed > WIDE_AFTER_S:
            print(f"d=256 medians skipped: {elapsed:.0f} s spent (budget of the whole script 120 s)")
            return
        emit(medians(4096, 256, 256))


if __name__ == "__main__":
    main()
