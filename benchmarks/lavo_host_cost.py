"""The host cost of one LAVO forward+backward on the Triton path, measured on a CPU.

    python benchmarks/lavo_host_cost.py [--calls N] [--cases CC,NC,...] [--ops]

Runs `lavo_attn(..., backend="triton")` forward+backward on CPU tensors under Triton's
interpreter with every kernel launch replaced by a no-op: the kernel bodies never run
(outputs and gradients are whatever `torch.empty` held), while everything the host does
around them is real: argument checks, the custom operators and their autograd, the
chunk tables, casts, copies, allocations. Per forward+backward it reports

- host ms: the median wall time of a call (after warm-up, so per-shape caches are full),
  at the case's shape and at a small one of the same structure (batch 1, lengths / 8):
  on a CPU the aten ops also do their arithmetic and touch fresh memory, so at full size
  a copy or fill costs far more than the few µs of its GPU launch, and the small shape's
  time is the closer measure of the Python and dispatch cost;
- aten ops: the operators dispatched (a TorchDispatchMode that counts each call,
  custom operators' insides included); on a GPU each costs ~5-10 µs of host time;
- kernel ops: those of the aten ops that run a kernel on a GPU (not an allocation, a
  view or a detach, NO_KERNEL; an op run from Python decomposes into its parts where one
  run inside a custom operator's body does not, so the totals of two versions compare
  best here);
- launches: the Triton kernel launches (~10-20 µs of host time each on a GPU).

Shapes: the kernel benchmark's (`lavo_tasks.bench`): bf16 q, k, v, 16 heads of 64,
rank 64, window 128 (the parameters as the lavo block passes them); cross patterns 512 targets over a 1,024 source, batch 8; self patterns
T = 1,024, batch 8. NC-mask adds a kv_mask with padding at the end of each source (the
summarizer's cross-attention), NC-seg4 four segments with that mask.
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

HEADS, DIM, RANK, WINDOW = 16, 64, 64, 128
CASES = {  # name -> (causal, cross, batch, n, m, masked, segments)
    "CS": (True, False, 8, 1024, 1024, False, 1),
    "NS": (False, False, 8, 1024, 1024, False, 1),
    "CC": (True, True, 8, 512, 1024, False, 1),
    "NC": (False, True, 8, 512, 1024, False, 1),
    "NC-mask": (False, True, 8, 512, 1024, True, 1),
    "NC-seg4": (False, True, 8, 512, 1024, True, 4),
}


# aten ops that launch no GPU kernel: allocations, views, detach
NO_KERNEL = frozenset(f"aten.{name}" for name in (
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "view", "_unsafe_view",
    "reshape", "expand", "select", "slice", "unsqueeze", "squeeze", "as_strided", "alias", "t", "transpose",
    "permute", "split", "unbind", "_reshape_alias", "lift_fresh",
))


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched while active. A custom operator counts once and
    its Python body then runs with the counter active again, so the aten ops inside it
    count too (a dispatch mode is otherwise off while it handles a call)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        opdef = _maybe_get_opdef(func)
        if opdef is not None:  # a torch.library.custom_op: its body, counted
            with self:
                return opdef._init_fn(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class NoLaunch:
    """While active, a Triton launch (under the interpreter) runs nothing and is counted."""

    def __init__(self):
        self.launches = Counter()

    def __enter__(self):
        self._run = InterpretedFunction.run
        launches = self.launches

        def run(fn, *args, grid, warmup, **kwargs):
            if not warmup:
                launches[fn.__name__] += 1

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        InterpretedFunction.run = self._run


def make_case(name, small=False):
    """The forward+backward callable of a case (its inputs and upstream gradient made
    once); small: batch 1 and lengths / 8."""
    from lavo_tasks.kernels import lavo_attn

    causal, cross, batch, n, m, masked, segments = CASES[name]
    if small:
        batch, n, m = 1, n // 8, m // 8
    g = torch.Generator().manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16)
    q = torch.randn(batch, n, HEADS, DIM, generator=g).to(**bf16).requires_grad_()
    k, v = (torch.randn(batch, m, HEADS, DIM, generator=g).to(**bf16).requires_grad_() for _ in range(2))
    # as the lavo block passes them: an fp32 basis, a transposed view [H, r, d] (the
    # learned basis's form), fp32 biases, the memory bias [H, S] in NC
    basis = torch.linalg.qr(torch.randn(HEADS, DIM, RANK, generator=g))[0].contiguous().requires_grad_()  # [H, d, r]
    mem_bias = torch.zeros((HEADS, segments) if cross and not causal else (HEADS,), requires_grad=True)
    rel_bias = None
    if (causal, cross) != (False, True):  # NC has no window
        rel_bias = torch.zeros(HEADS, WINDOW + (0 if causal else 1), requires_grad=True)
    kv_mask = None
    if masked:  # each source ends in padding, a different amount per row
        lengths = torch.linspace(m // 2, m, batch).long()
        kv_mask = torch.arange(m)[None, :] < lengths[:, None]
    upstream = torch.randn(batch, n, HEADS, DIM, generator=g).to(**bf16)
    leaves = [x for x in (q, k, v, basis, rel_bias, mem_bias) if x is not None]

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        o = lavo_attn(q, k, v, basis.transpose(1, 2), rel_bias, mem_bias, window=WINDOW, causal=causal, cross=cross,
                      segments=segments, kv_mask=kv_mask, backend="triton")
        o.backward(upstream)

    return fwd_bwd


def host_ms(fwd_bwd, calls):
    """Median ms of fwd_bwd() over `calls` calls, after 3 (per-shape caches, Triton's
    rewritten functions)."""
    for _ in range(3):
        fwd_bwd()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fwd_bwd()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def use_interpreter():
    """Run the kernels under Triton's interpreter: set before lavo_tasks' kernels are first
    imported (Triton reads it when it decorates a kernel)."""
    os.environ["TRITON_INTERPRET"] = "1"


def measure(name, calls, make_case=make_case):
    """{case, host_ms, small_ms, aten_ops, kernel_ops, launches, ops (Counter), kernels (Counter)}
    of the forward+backward that make_case(name, small) returns."""
    fwd_bwd = make_case(name)
    with NoLaunch() as counted:
        full = host_ms(fwd_bwd, calls)
        small = host_ms(make_case(name, small=True), 4 * calls)
        counted.launches.clear()
        with OpCounter() as ops:
            fwd_bwd()
    aten = {op: count for op, count in ops.ops.items() if op.startswith("aten.")}
    return dict(case=name, host_ms=full, small_ms=small, aten_ops=sum(aten.values()),
                kernel_ops=sum(count for op, count in aten.items() if op not in NO_KERNEL),
                launches=sum(counted.launches.values()), ops=ops.ops, kernels=counted.launches)


def print_results(results, show_ops):
    """The table of `measure`'s results; show_ops: then each case's operators and kernels."""
    print("| case | host ms | host ms, small | aten ops | kernel ops | Triton launches |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['host_ms']:.2f} | {r['small_ms']:.2f} | {r['aten_ops']} | {r['kernel_ops']} "
              f"| {r['launches']} |")
    if show_ops:
        for r in results:
            print(f"\n{r['case']}: " + ", ".join(f"{op} x{n}" for op, n in r["ops"].most_common()))
            print("  kernels: " + ", ".join(f"{k} x{n}" for k, n in r["kernels"].most_common()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="timed forward+backward calls per case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument("--ops", action="store_true", help="list each case's operators and kernels")
    args = parser.parse_args(argv)
    use_interpreter()
    torch.set_num_threads(1)
    print_results([measure(name, args.calls) for name in args.cases.split(",")], args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
