"""The host cost of one GSA forward+backward on the Triton path, measured on a CPU.

    python benchmarks/gsa_host_cost.py [--calls N] [--cases CS,NS,...] [--ops]

As `lavo_host_cost.py` (whose `measure` and table it uses): the GSA layer's
attention call, `gsa_attn(..., backend="triton")`, and its output norm
(`silu_rms_norm(..., use_triton=True)`), forward+backward on CPU tensors under Triton's
interpreter with every kernel launch a no-op, so only the host's work around the
kernels is timed and counted. Shapes: the tts backbone's at `model.preset=cab` (batch 16,
4 heads of 128, 64 slots), the ones `launch_sweep.py --family gsa` times on the GPU:
CS over 512, NS over 128 (below the one-scan bound: one scan of both directions), CC 512
over a 128-position source. "norm" is the output norm alone on CS's output.
"""

import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
from lavo_host_cost import measure, print_results  # noqa: E402

BATCH, HEADS, DIM, SLOTS = 16, 4, 128, 64
CASES = {  # name -> (causal, cross, n, m)
    "CS": (True, False, 512, 512),
    "NS": (False, False, 128, 128),
    "CC": (True, True, 512, 128),
    "NC": (False, True, 512, 128),
    "norm": None,
}


def make_case(name, small=False):
    """The forward+backward callable of a case; small: batch 1 and lengths / 8."""
    from lavo_tasks.kernels import gsa_attn
    from lavo_tasks.kernels.gsa.output_norm import silu_rms_norm

    causal, cross, n, m = CASES[name] or CASES["CS"]
    batch = 1 if small else BATCH
    if small:
        n, m = n // 8, m // 8
    g = torch.Generator().manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16)
    upstream = torch.randn(batch, n, HEADS, DIM, generator=g).to(**bf16)
    if name == "norm":
        x = torch.randn(batch, n, HEADS, DIM, generator=g).to(**bf16).requires_grad_()
        weight = torch.ones(DIM, requires_grad=True)
        leaves = [x, weight]

        def run():
            return silu_rms_norm(x, weight, 1e-5, use_triton=True)
    else:
        q = torch.randn(batch, n, HEADS, DIM, generator=g).to(**bf16).requires_grad_()
        k, v = (torch.randn(batch, m, HEADS, DIM, generator=g).to(**bf16).requires_grad_() for _ in range(2))
        # fp32 log-gates, as the layer passes them (logsigmoid of a projection, over a temperature)
        log_alpha = torch.nn.functional.logsigmoid(torch.randn(batch, m, HEADS, SLOTS, generator=g)) / 8
        log_alpha.requires_grad_()
        leaves = [q, k, v, log_alpha]

        def run():
            return gsa_attn(q, k, v, log_alpha, causal=causal, cross=cross, backend="triton")[0]

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        run().backward(upstream)

    return fwd_bwd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="timed forward+backward calls per case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument("--ops", action="store_true", help="list each case's operators and kernels")
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {sorted(unknown)}; the cases are {list(CASES)}")
    torch.set_num_threads(1)
    print_results([measure(name, args.calls, make_case) for name in args.cases.split(",")], args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
