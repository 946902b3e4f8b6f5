"""The host cost of one GSA forward+backward on the Triton path, on a CPU or a GPU.

    python benchmarks/gsa_host_cost.py [--shape tts|tsf] [--calls N] [--cases CS,NS,...] [--ops | --cuda]

As `lavo_host_cost.py` (whose `measure` and table it uses): the GSA layer's
attention call, `gsa_attn(..., backend="triton")`, and its output norm
(`silu_rms_norm(..., use_triton=True)`), forward+backward on CPU tensors under Triton's
interpreter with every kernel launch a no-op, so only the host's work around the
kernels is timed and counted. Shapes (64 slots): `--shape tts` (the default), the tts
backbone's at `model.preset=cab` (batch 16, 4 heads of 128), the ones
`launch_sweep.py --family gsa` times on the GPU: CS over 512, NS over 128 (below the
one-scan bound: one scan of both directions), CC and NC 512 over a 128-position source;
`--shape tsf`, the tsf backbone's at `model.preset=cab` (batch 32, 8 heads of 64): the
decoder's 72 positions (CS, and CC / NC over the encoder's 96), NS over the encoder's 96.
"norm" is the output norm alone on CS's output.

--cuda runs the kernels on the GPU instead and reports, per forward+backward, the host's
µs to issue it (calls back to back, no sync between them), the wall µs until the last
kernel ends (where the host's µs are the larger, the call is bound by its host) and the
µs the GPU spends in kernels (torch.profiler, over 10 more calls).
"""

import argparse
import functools
import sys
import time

import torch
from lavo_host_cost import measure, print_results, use_interpreter

SLOTS = 64
SHAPES = {  # name -> (batch, heads, head dim, {case: (causal, cross, n, m)})
    "tts": (16, 4, 128, {"CS": (True, False, 512, 512), "NS": (False, False, 128, 128),
                         "CC": (True, True, 512, 128), "NC": (False, True, 512, 128)}),
    "tsf": (32, 8, 64, {"CS": (True, False, 72, 72), "NS": (False, False, 96, 96),
                        "CC": (True, True, 72, 96), "NC": (False, True, 72, 96)}),
}
CASES = ["CS", "NS", "CC", "NC", "norm"]


def make_case(name, small=False, device="cpu", shape="tts"):
    """The forward+backward callable of a case; small: batch 1 and lengths / 8."""
    from lavo_tasks.kernels import gsa_attn
    from lavo_tasks.kernels.gsa.output_norm import silu_rms_norm

    batch, heads, dim, patterns = SHAPES[shape]
    causal, cross, n, m = patterns["CS" if name == "norm" else name]
    batch = 1 if small else batch
    if small:
        n, m = n // 8, m // 8
    g = torch.Generator().manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16, device=device)
    upstream = torch.randn(batch, n, heads, dim, generator=g).to(**bf16)
    if name == "norm":
        x = torch.randn(batch, n, heads, dim, generator=g).to(**bf16).requires_grad_()
        weight = torch.ones(dim, device=device, requires_grad=True)
        leaves = [x, weight]

        def run():
            return silu_rms_norm(x, weight, 1e-5, use_triton=True)
    else:
        q = torch.randn(batch, n, heads, dim, generator=g).to(**bf16).requires_grad_()
        k, v = (torch.randn(batch, m, heads, dim, generator=g).to(**bf16).requires_grad_() for _ in range(2))
        # fp32 log-gates, as the layer passes them (logsigmoid of a projection, over a temperature)
        log_alpha = torch.nn.functional.logsigmoid(torch.randn(batch, m, heads, SLOTS, generator=g)) / 8
        log_alpha = log_alpha.to(device).requires_grad_()
        leaves = [q, k, v, log_alpha]

        def run():
            return gsa_attn(q, k, v, log_alpha, causal=causal, cross=cross, backend="triton")[0]

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        run().backward(upstream)

    return fwd_bwd


def cuda_us(fwd_bwd, calls):
    """(host µs, wall µs, GPU-kernel µs) per call of fwd_bwd on the GPU, after 20 warm-up
    calls: the time to issue `calls` calls back to back, to the end of their last kernel,
    and the kernels' total time over 10 more calls, from the profiler."""
    for _ in range(20):
        fwd_bwd()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fwd_bwd()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fwd_bwd()
        torch.cuda.synchronize()
    kernels = sum(event.self_device_time_total for event in prof.key_averages()) / 10
    return 1e6 * (issued - start) / calls, 1e6 * (done - start) / calls, kernels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="tts", help="the task backbone whose sizes to take")
    parser.add_argument("--calls", type=int, default=50, help="timed forward+backward calls per case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--ops", action="store_true", help="list each case's operators and kernels")
    group.add_argument("--cuda", action="store_true", help="time the kernels on the GPU instead")
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {sorted(unknown)}; the cases are {CASES}")
    make = functools.partial(make_case, shape=args.shape)
    if args.cuda:
        print("| case | host µs | wall µs | GPU-kernel µs |")
        print("|---|---|---|---|")
        for name in args.cases.split(","):
            host, wall, kernels = cuda_us(make(name, device="cuda"), args.calls)
            print(f"| {name} | {host:.1f} | {wall:.1f} | {kernels:.1f} |")
        return 0
    use_interpreter()
    torch.set_num_threads(1)
    print_results([measure(name, args.calls, make) for name in args.cases.split(",")], args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
