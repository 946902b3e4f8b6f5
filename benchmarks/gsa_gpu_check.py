"""Time the GSA Triton kernels on a GPU beside the peer (fla's `chunk_gsa`) and SDPA.

    python benchmarks/gsa_gpu_check.py [--out DIR] [--lengths 1024,2048,...]
        [--variants base,values_bf16,...]

Protocol of docs/design.md §4: bf16, H=16, head dim 64, 64 slots, 65,536 tokens per step
(B = 65536 / T), medians of `triton.testing.do_bench`, forward and forward+backward
(sum of outputs, backward), peak memory of forward+backward; B=1, T=128K; decode latency
with batch 8. Writes JSON lines to DIR/gsa_timing.jsonl and a per-kernel breakdown
(torch.profiler) of one fwd+bwd at the shortest and longest T; prints a table last.
The benchmark of record is `lavo_tasks.bench` (the lead's); this is the kernel author's check.
fla's `chunk_gsa` autotunes on first use (minutes on an H200): `--impls gsa,sdpa` skips it.
`--variants` times the GSA kernels again with other dot precisions / warps (VARIANTS) and
measures each one's error against the fp32 PyTorch path at T=8K (limit 5e-3 relative RMS).
Measured numbers: docs/benchmarks.md.
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from lavo_tasks.kernels import gsa_attn, gsa_decode_step
from lavo_tasks.kernels.gsa import chunk

HEADS, DIM, SLOTS, TOKENS = 16, 64, 64, 65536
# settings of `chunk` to compare against its defaults ("base")
VARIANTS = {
    "base": {},
    "values_tf32": {"PREC_VALUES": "tf32"},
    "key_warps8": {"WHOLE_WARPS": {"output": 4, "query": 4, "key": 8}},
    "query_warps8": {"WHOLE_WARPS": {"output": 4, "query": 8, "key": 4}},
    "blocks32": {"WHOLE_BC": 32},  # blocks of 32 rows in the whole-chunk kernels' intra-chunk split
    "sub_chunks": {"WHOLE_MAX_SLOTS": 0},  # the per-sub-chunk kernels (those of wide sizes)
}
VARIANT_SECONDS = 150  # no variant starts after this many seconds of the run (compiles dominate)


def _inputs(batch, length, device="cuda"):
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, length, HEADS, DIM, device=device, dtype=torch.bfloat16) for _ in range(3))
    la = (F.logsigmoid(torch.randn(batch, length, HEADS, SLOTS, device=device)) / 8).to(torch.bfloat16)
    return [x.requires_grad_() for x in (q, k, v, la)]


def _ours(q, k, v, la):
    return gsa_attn(q, k, v, la, backend="triton")[0]


def _fla(q, k, v, la):
    from fla.ops.gsa import chunk_gsa

    return chunk_gsa(q, k, v, (1 - la.float().exp()).to(la.dtype), la)[0]


def _sdpa(q, k, v, la):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


def _measure(fn, xs):
    fwd = do_bench(lambda: fn(*xs), warmup=25, rep=100, return_mode="median")

    def step():
        fn(*xs).sum().backward()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    both = do_bench(step, warmup=25, rep=100, return_mode="median", grad_to_none=xs)
    return fwd, both, peak


def _error_inputs():
    """T=8K, B=1, H=4 bf16 inputs, the weights of a random projection of the output, and
    the fp32 PyTorch path's output and gradients on them (the reference of `_errors`)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 8192, 4, DIM, device="cuda").bfloat16() for _ in range(3))
    la = (F.logsigmoid(torch.randn(1, 8192, 4, SLOTS, device="cuda") * 2) / 4).bfloat16()
    w = torch.randn(1, 8192, 4, DIM, device="cuda")
    return (q, k, v, la), w, _outputs_and_grads("torch", torch.float32, (q, k, v, la), w)


def _outputs_and_grads(backend, dtype, xs, w):
    xs = [x.detach().to(dtype).clone().requires_grad_() for x in xs]
    o = gsa_attn(*xs, backend=backend)[0]
    (o.float() * w).sum().backward()
    return [o] + [x.grad for x in xs]


def _errors(xs, w, ref):
    """Relative RMS error of the bf16 kernels against the fp32 PyTorch path (same inputs)."""
    fast = _outputs_and_grads("triton", torch.bfloat16, xs, w)
    names = ["o", "dq", "dk", "dv", "dlog_alpha"]
    return {n: ((a.double() - b.double()).norm() / b.double().norm()).item() for n, a, b in zip(names, fast, ref)}


def _set_variant(name):
    """Apply VARIANTS[name] to `chunk` (defaults first)."""
    for key, value in {**_DEFAULTS, **VARIANTS[name]}.items():
        setattr(chunk, key, value)


_DEFAULTS = {key: getattr(chunk, key) for variant in VARIANTS.values() for key in variant}


def _breakdown(fn, xs, label, out_dir):
    """Per-kernel CUDA times of one fwd+bwd (after a warm-up), to a text file."""
    fn(*xs).sum().backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*xs).sum().backward()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    with open(os.path.join(out_dir, f"profile_{label}.txt"), "w") as f:
        f.write(table)
    print(label)
    if label.startswith("gsa"):
        _print_resources()
    for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:10]:
        print(f"  {event.device_time_total / 1000:8.3f} ms  x{event.count:<3d} {event.key[:70]}")


def _print_resources():
    """Registers, spills and shared memory of every compiled GSA kernel variant."""
    from lavo_tasks.kernels.gsa import chunk_kernels, whole_chunk_kernels

    kernels = [(name, getattr(module, name)) for module in (chunk_kernels, whole_chunk_kernels)
               for name in dir(module) if name.endswith("_kernel")]
    for name, fn in kernels:
        for caches in getattr(fn, "device_caches", {}).values():
            for kernel in caches[0].values():
                kernel._init_handles()
                precs = [v for v in getattr(kernel.src, "constexprs", {}).values() if isinstance(v, str)]
                print(f"  {name}: regs {kernel.n_regs} spills {kernel.n_spills} shared {kernel.metadata.shared}"
                      f" warps {kernel.metadata.num_warps} stages {kernel.metadata.num_stages} {'/'.join(precs)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768,65536")
    parser.add_argument("--impls", default="gsa,fla_chunk_gsa,sdpa", help="any of gsa, fla_chunk_gsa, sdpa")
    parser.add_argument("--quick", action="store_true", help="skip the 128K run and the decode timing")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"GSA settings to time and check for accuracy, any of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    start = time.time()
    known = {"gsa": _ours, "fla_chunk_gsa": _fla, "sdpa": _sdpa}
    impls = {name: known[name] for name in args.impls.split(",")}
    if "fla_chunk_gsa" in impls:
        try:
            import fla.ops.gsa  # noqa: F401
        except ImportError:
            del impls["fla_chunk_gsa"]
    rows = []
    log = open(os.path.join(args.out, "gsa_timing.jsonl"), "w")
    lengths = [int(x) for x in args.lengths.split(",")]
    for length in lengths:
        xs = _inputs(TOKENS // length, length)
        for name, fn in impls.items():
            fwd, both, peak = _measure(fn, xs)
            row = dict(impl=name, T=length, B=TOKENS // length, fwd_ms=fwd, fwdbwd_ms=both, peak_mib=peak)
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)
        if length in (lengths[0], lengths[-1]):
            _breakdown(_ours, xs, f"gsa_T{length}", args.out)
            if "fla_chunk_gsa" in impls:
                _breakdown(_fla, xs, f"fla_T{length}", args.out)
        del xs
    _table(rows, impls, lengths)
    _compare_variants(args.variants.split(","), lengths, log, start)
    if args.quick:
        return
    # one sequence of 128K
    xs = _inputs(1, 131072)
    fwd, both, peak = _measure(_ours, xs)
    row = dict(impl="gsa", T=131072, B=1, fwd_ms=fwd, fwdbwd_ms=both, peak_mib=peak)
    rows.append(row)
    log.write(json.dumps(row) + "\n")
    del xs
    # decode: batch 8, one token against a constant-size state (any context length)
    batch = 8
    q, k, v = (torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    la = (F.logsigmoid(torch.randn(batch, HEADS, SLOTS, device="cuda")) / 8).to(torch.bfloat16)
    state = (torch.randn(batch, HEADS, SLOTS, DIM, device="cuda"), torch.randn(batch, HEADS, SLOTS, DIM, device="cuda"))
    dec = do_bench(lambda: gsa_decode_step(q, k, v, la, state, backend="triton"), warmup=25, rep=100,
                   return_mode="median")
    row = dict(impl="gsa_decode_step", B=batch, ms_per_token=dec,
               state_mib=sum(s.numel() * 4 for s in state) / 2**20)
    log.write(json.dumps(row) + "\n")
    log.close()
    _table(rows, impls, lengths)
    r = rows[-1]
    print(f"gsa B=1 T=128K: {r['fwd_ms']:.2f} / {r['fwdbwd_ms']:.2f} ms ({r['peak_mib']:.0f} MiB)")
    print(f"gsa decode step, batch 8: {dec * 1000:.1f} us per token")


def _compare_variants(names, lengths, log, start):
    """fwd / fwd+bwd at the shortest and longest length and the error against the fp32 path
    for each GSA variant, while the run is younger than VARIANT_SECONDS."""
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    err_inputs = _error_inputs()
    for name in names:
        if time.time() - start > VARIANT_SECONDS:
            print(f"variant {name}: not run (the run is past {VARIANT_SECONDS} s)", flush=True)
            continue
        _set_variant(name)
        cells = []
        for length in sorted({lengths[0], lengths[-1]}):
            fwd, both, _ = _measure(_ours, _inputs(TOKENS // length, length))
            cells.append(f"T={length}: {fwd:.2f} / {both:.2f}")
            log.write(json.dumps(dict(impl=f"gsa:{name}", T=length, fwd_ms=fwd, fwdbwd_ms=both)) + "\n")
        errors = _errors(*err_inputs)
        log.write(json.dumps(dict(impl=f"gsa:{name}", rel_rms_8k=errors)) + "\n")
        log.flush()
        print(f"variant {name}: " + "  ".join(cells) + " ms\n  rel RMS at 8K vs fp32 torch path (limit 5e-3): "
              + " ".join(f"{n}={e:.1e}" for n, e in errors.items()), flush=True)
    _set_variant("base")
    print("kernels compiled (all variants):")
    _print_resources()


def _table(rows, impls, lengths):
    print(f"\n{torch.cuda.get_device_name()}  bf16 H={HEADS} d={DIM} M={SLOTS}  fwd / fwd+bwd ms (peak MiB)")
    names = list(impls)
    print("T".rjust(7) + "".join(n.rjust(30) for n in names))
    for length in lengths:
        cells = []
        for name in names:
            r = next(x for x in rows if x["impl"] == name and x["T"] == length)
            cells.append(f"{r['fwd_ms']:.2f} / {r['fwdbwd_ms']:.2f} ({r['peak_mib']:.0f})".rjust(30))
        print(str(length).rjust(7) + "".join(cells))


if __name__ == "__main__":
    main()
