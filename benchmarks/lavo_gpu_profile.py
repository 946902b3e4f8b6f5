"""Time the LAVO Triton kernels on a GPU: medians and per-kernel CUDA time.

    python benchmarks/lavo_gpu_profile.py [--out FILE] [--variants [NAME ...]]

Protocol shape (bf16, H=16, d=64, w=128, r=64, 65,536 tokens per step): forward and
forward+backward medians (`triton.testing.do_bench`) at T = 1K and 8K; one profiler
table of the kernels of a forward+backward at 4K (gradients reset first, so the table
holds no gradient accumulation); then, if the rest took under WIDE_AFTER_S seconds, the
medians at head dim 256, rank 256, T = 4K. JSON lines go to FILE as they come; the whole
benchmark against SDPA and FlexAttention is `python -m lavo_tasks.bench`.

With `--variants` (all of VARIANTS, or the names given) it times instead, for each
variant, the forward and forward+backward medians at T = 1K and 8K with chunk.py's
LAUNCH (or an integer constant) patched as the variant says, checks the variant's
output and gradients (B = 4, T = 1K, nonzero biases) against the fp32 PyTorch path
(largest relative RMS error; WRONG above CHECK_TOL, as tests/kernels/test_gpu_lavo.py's bf16
tests), then prints a table sorted by the 8K forward+backward time and the kernel
table of the fastest correct variant. Variants past VARIANTS_BUDGET_S seconds are
skipped (listed); the d = 256 medians are not run.
"""

import argparse
import contextlib
import copy
import json
import time

import torch
from triton.testing import do_bench

from lavo_tasks.kernels.lavo import chunk
from lavo_tasks.kernels.lavo.chunk import chunk_lavo_attn
from lavo_tasks.kernels.lavo.torch_path import torch_lavo_attn

HEADS, DIM, WINDOW, RANK, TOKENS = 16, 64, 128, 64, 65536
WIDE_AFTER_S = 75  # the d = 256 medians (more kernels to compile) run only if the rest took less
VARIANTS_BUDGET_S = 110  # --variants: no new variant starts after this (compiles take a few s a kernel)
CHECK_TOL = 5e-3  # --variants: relative RMS error allowed against the fp32 PyTorch path (docs/design.md §2.5)
# name -> settings: "kernel.option" patches chunk.LAUNCH[kernel][option], an upper-case
# name the integer constant chunk.NAME; "default" patches nothing. The others are the
# launch settings next to the defaults (their timings: docs/benchmarks.md, "Launch
# settings").
VARIANTS = {  # in the order they run
    "default": {},
    "dkv_stages1": {"dkv.num_stages": 1},  # without the query tiles' loads pipelined
    "dkv_split1": {"dkv.SPLIT": 1},  # 64-query tiles: wgmma for all products (ptxas: 420 B spills at 2 stages)
    "dkv_split1_stages1": {"dkv.SPLIT": 1, "dkv.num_stages": 1},
    "mem_bwd_group16": {"DQ_GROUP": 16},  # query chunks per memory-backward program (8)
}


def inputs(T, dim=DIM, rank=RANK):
    B = TOKENS // T
    q, k, v = (torch.randn(B, T, HEADS, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    basis = torch.linalg.qr(torch.randn(HEADS, dim, rank, device="cuda"))[0].transpose(1, 2).contiguous()
    rel_bias = torch.zeros(HEADS, WINDOW, device="cuda")
    mem_bias = torch.zeros(HEADS, device="cuda")
    return [x.requires_grad_() for x in (q, k, v, basis, rel_bias, mem_bias)]


def medians(T, dim=DIM, rank=RANK, leaves=None):
    """fwd and fwd+bwd medians (ms), on `leaves` if given (inputs(T, dim, rank))."""
    leaves = inputs(T, dim, rank) if leaves is None else leaves
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
    return _profile(leaves)


def _profile(leaves):
    for _ in range(3):
        chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
    for x in leaves:
        x.grad = None
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        chunk_lavo_attn(*leaves, window=WINDOW).float().sum().backward()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)


@contextlib.contextmanager
def patched(settings):
    """chunk.LAUNCH and chunk's upper-case integer constants with `settings` (a VARIANTS
    entry) applied, restored after."""
    saved_launch, saved_constants = copy.deepcopy(chunk.LAUNCH), {}
    try:
        for key, value in settings.items():
            kernel, _, option = key.rpartition(".")
            if kernel in chunk.LAUNCH:
                chunk.LAUNCH[kernel][option] = value
            elif not kernel and key.isupper() and isinstance(getattr(chunk, key, None), int):
                saved_constants[key] = getattr(chunk, key)
                setattr(chunk, key, value)
            else:
                raise KeyError(f"variant setting {key!r}: not a chunk.LAUNCH kernel's option or a chunk constant")
        yield
    finally:
        chunk.LAUNCH.clear()
        chunk.LAUNCH.update(saved_launch)
        for key, value in saved_constants.items():
            setattr(chunk, key, value)


def outputs_and_grads(run, leaves, grad_out):
    """The output and the six gradients of run(*leaves) (a fresh copy of each leaf), as fp64."""
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    out = run(*leaves)
    out.backward(grad_out.to(out.dtype))
    return [out.detach().double()] + [x.grad.double() for x in leaves]


def check_inputs(batch=4, T=1024):
    """bf16 q, k, v and nonzero biases, for the checks against the fp32 PyTorch path."""
    q, k, v, basis, _, _ = inputs(T)
    q, k, v = (x.detach()[:batch] for x in (q, k, v))
    biases = 0.5 * torch.randn(HEADS, WINDOW, device=q.device), torch.randn(HEADS, device=q.device)
    return [q, k, v, basis.detach(), *biases]


def run_variants(names, emit, started):
    """Medians per variant, its error against the fp32 PyTorch path, a summary and the
    fastest correct one's kernel table."""
    leaves = {T: inputs(T) for T in (1024, 8192)}
    checked = check_inputs()
    grad_out = torch.randn_like(checked[0], dtype=torch.float32).to(checked[0].dtype).float()  # exact in bf16 too
    options = dict(window=WINDOW, causal=True, cross=False, segments=1, scale=None, kv_mask=None, cu_seqlens=None)
    fp32 = [x.float() for x in checked]
    reference = outputs_and_grads(lambda *xs: torch_lavo_attn(*xs, **options), fp32, grad_out)
    rows, skipped = [], []
    for name in names:
        if time.monotonic() - started > VARIANTS_BUDGET_S:
            skipped.append(name)
            continue
        with patched(VARIANTS[name]):
            got = outputs_and_grads(lambda *xs: chunk_lavo_attn(*xs, window=WINDOW), checked, grad_out)
            error = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, reference))
            times = [medians(T, leaves=leaves[T]) for T in (1024, 8192)]
        row = {"variant": name, "settings": VARIANTS[name], "max_rel_rms_error": error, "ok": error <= CHECK_TOL}
        for t in times:
            row[f"fwd_ms_{t['T']}"], row[f"fwd_bwd_ms_{t['T']}"] = t["fwd_ms"], t["fwd_bwd_ms"]
        emit(row)
        rows.append(row)
    print(f"{'variant':28s} {'fwd 1K':>8s} {'fwd 8K':>8s} {'f+b 1K':>8s} {'f+b 8K':>8s} {'error':>8s}")
    for row in sorted(rows, key=lambda r: r["fwd_bwd_ms_8192"]):
        print(
            f"{row['variant']:28s} {row['fwd_ms_1024']:8.3f} {row['fwd_ms_8192']:8.3f} {row['fwd_bwd_ms_1024']:8.3f} "
            f"{row['fwd_bwd_ms_8192']:8.3f} {row['max_rel_rms_error']:8.1e}{'' if row['ok'] else ' WRONG'}"
        )
    if skipped:
        print(f"skipped (past {VARIANTS_BUDGET_S} s): {' '.join(skipped)}")
    del leaves, reference
    correct = [row for row in rows if row["ok"]]
    if correct:
        best = min(correct, key=lambda r: r["fwd_bwd_ms_8192"])
        print(f"kernels of the fastest correct variant, {best['variant']}, T = 4K:")
        with patched(VARIANTS[best["variant"]]):
            print(kernel_table(4096), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="lavo_profile.jsonl")
    parser.add_argument(
        "--variants", nargs="*", choices=list(VARIANTS), metavar="NAME",
        help=f"time these VARIANTS instead (none named: all): {', '.join(VARIANTS)}",
    )
    args = parser.parse_args()
    started = time.monotonic()
    with open(args.out, "w") as f:

        def emit(row):
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)

        if args.variants is not None:
            run_variants(args.variants or list(VARIANTS), emit, started)
            return
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
