"""The host's µs per kernel launch on a GPU: small PyTorch ops, a Triton kernel launched as
the kernels launch theirs (`kernel[grid]` called: JITFunction.run's argument binding,
cache key and checks) and the same compiled kernel's launcher called directly, bypassing
JITFunction.run (its arguments in Triton 3.6's order, the constexprs included).

    python benchmarks/launch_cost.py

The kernel is GSA's `_add_chunk_suffix_kernel` (13 arguments) on a small grid; each figure
is the min and median over 5 rounds of 2,000 calls issued back to back.
"""

import time

import torch
from triton import knobs

from lavo_tasks.kernels.gsa import whole_chunk_kernels as W


def host_us(fn, n=2000):
    """(min, median) host µs per call of fn over 5 rounds of n calls, after 50."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(best), sorted(best)[2]


def main():
    dev = "cuda"
    NC, H, M = 8, 4, 64  # chunks, heads, slots
    dg = torch.zeros(NC * 64, H, M, device=dev)
    before = torch.zeros(H, M, NC, device=dev, dtype=torch.float64)
    carry = torch.zeros(1, H, M, device=dev)
    chunks = torch.stack([torch.arange(NC) * 64, torch.full((NC,), NC * 64)], 1).to(dev)
    seq = torch.zeros(NC, dtype=torch.int64, device=dev)
    a, b = torch.zeros(64, device=dev), torch.zeros(64, device=dev)
    args = (dg, before, carry, chunks, seq, H, M, *before.stride())
    kw = dict(HAS_CARRY=True, BT=64, BM=64, num_warps=4)
    print("torch.add small: min %.1f median %.1f us" % host_us(lambda: torch.add(a, b)))
    print("torch.empty small: min %.1f median %.1f us" % host_us(lambda: torch.empty(64, device=dev)))
    print("JIT launch (13 args): min %.1f median %.1f us"
          % host_us(lambda: W._add_chunk_suffix_kernel[(NC, H)](*args, **kw)))
    k = W._add_chunk_suffix_kernel[(NC, H)](*args, **kw)  # the compiled kernel
    stream = torch.cuda.current_stream().cuda_stream
    full = (*args, True, 64, 64)  # the constexprs' values follow the arguments

    def direct():
        k.run(NC, H, 1, stream, k.function, k.packed_metadata, None, None, None, *full)

    try:
        print("direct launcher: min %.1f median %.1f us" % host_us(direct))
    except Exception as e:  # (the launcher's signature is Triton's internal)
        print("direct failed:", type(e).__name__, e)
    print("current_device: min %.2f median %.2f us" % host_us(lambda: torch.cuda.current_device()))
    print("knobs.runtime.debug: min %.2f median %.2f us" % host_us(lambda: knobs.runtime.debug))
    print("current stream: min %.2f median %.2f us" % host_us(lambda: torch.cuda.current_stream().cuda_stream))


if __name__ == "__main__":
    main()
