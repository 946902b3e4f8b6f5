"""Rotary positions on a GPU: the fused kernel against the PyTorch form, per call and in a
softmax self-attention block.

    python benchmarks/rope_host_cost.py [--calls N]

At the tts backbone's `model.preset=cab` shape (batch 16, 512 positions, 4 heads of 128,
bf16): forward+backward of `apply_rope` alone, and of a causal `softmax` block (whose
queries and keys it rotates) under bf16 autocast, each with the kernel (what eager CUDA
calls run) and with the PyTorch form, alternated over 5 rounds in one process. Per
forward+backward: the host's µs to issue it (calls back to back), the wall µs to the end
of the last kernel and the GPU's kernel µs (as `gsa_host_cost.py --cuda` reports them),
the median of the rounds.
"""

import argparse
import os
import statistics
import sys
from unittest import mock

import torch
from gsa_host_cost import cuda_us

BATCH, LENGTH, HEADS, DIM = 16, 512, 4, 128


def cases():
    """name -> forward+backward callable."""
    from lavo_tasks.attention import block_class
    from lavo_tasks.attention.rope import apply_rope

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(BATCH, LENGTH, HEADS, DIM, device="cuda", generator=g).bfloat16().requires_grad_()
    up = torch.randn(BATCH, LENGTH, HEADS, DIM, device="cuda", generator=g).bfloat16()
    block = block_class("softmax")(HEADS * DIM, HEADS, causal=True, cross=False).cuda()
    h = torch.randn(BATCH, LENGTH, HEADS * DIM, device="cuda", generator=g, requires_grad=True)

    def rope():
        x.grad = None
        apply_rope(x, 0).backward(up)

    def softmax_block():
        h.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y, _ = block(h)
        y.float().sum().backward()

    return {"apply_rope": rope, "softmax CS block": softmax_block}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="timed forward+backward calls per round")
    args = parser.parse_args(argv)
    results = {}
    for _ in range(5):
        for name, fwd_bwd in cases().items():
            for form in ("kernel", "PyTorch"):
                backend = "triton" if form == "kernel" else "torch"
                with mock.patch.dict(os.environ, {"LAVO_TASKS_BACKEND": backend}):  # (the blocks pass "auto")
                    results.setdefault((name, form), []).append(cuda_us(fwd_bwd, args.calls))
    print("| case | rotation | host µs | wall µs | GPU-kernel µs |")
    print("|---|---|---|---|---|")
    for (name, form), rounds in results.items():
        host, wall, kernels = (statistics.median(r[i] for r in rounds) for i in range(3))
        print(f"| {name} | {form} | {host:.1f} | {wall:.1f} | {kernels:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
