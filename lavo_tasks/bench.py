"""Kernel benchmark: attention time and memory against sequence length, on one GPU.

    python -m lavo_tasks.bench [--out DIR] [--lengths 1024,2048,...] [--ops softmax,lavo,...]
                               [--patterns CS,NS,CC,NC]

The protocol is docs/design.md §4: bf16 inputs, 16 heads of dim 64, a fixed
65,536 tokens per step (batch = 65536 / T), forward and forward+backward (sum of the
outputs, backward) as medians of `triton.testing.do_bench`, the forward+backward
also replayed back to back from one CUDA graph (`do_bench_cudagraph`: no host work
between calls and a warm L2 cache; in brackets in the table), peak memory of one
forward+backward from `torch.cuda.max_memory_allocated`; then B=1, T=128K; then decode
latency per token with batch 8 against SDPA over a KV cache (measured first: it is
quick). Every attention runs in the same process, side by side:

- softmax: torch SDPA with the FlashAttention backend, causal;
- softmax_default: the same call with no backend forced, as a user writes it (on
  Hopper torch picks cuDNN attention, faster than FlashAttention at these shapes);
  ratios against softmax are stated against the faster of the two;
- local: FlexAttention with a causal sliding window of 128;
- lavo: `lavo_attn` (window 128, rank 64), the toolkit's kernels;
- gsa: `gsa_attn` (64 slots), the toolkit's kernels;
- fla_gsa: flash-linear-attention's `chunk_gsa` (the peer implementation of GSA), only
  when that optional package is installed.

`--patterns` (default CS) adds the other attention patterns: NS (noncausal
self-attention, the same shapes; SDPA without the causal mask as the peer), and CC and NC
(cross-attention of CROSS_TARGET = 512 target positions, batch CROSS_BATCH = 8, over
sources of the `--lengths` from 1K to 16K; SDPA causal (query t sees source positions
<= t, SDPA's top-left causal mask; with the memory-efficient backend, as FlashAttention
takes no causal mask over a longer source) and unmasked as the peers). `local` runs CS and NS,
`fla_gsa` CS only.

Writes DIR/bench.jsonl (one JSON object per measurement) and DIR/bench.png, and prints
a Markdown table. Needs CUDA: timings on a CPU mean nothing.
"""

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

HEADS, HEAD_DIM, WINDOW, RANK, SLOTS = 16, 64, 128, 64, 64
TOKENS_PER_STEP = 65536
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
LONG = 131072
DECODE_CONTEXTS = (4096, 32768, 131072)
DECODE_BATCH = 8
ALL_OPS = ("softmax", "softmax_default", "local", "lavo", "gsa", "fla_gsa")
PATTERNS = ("CS", "NS", "CC", "NC")
OP_PATTERNS = {"local": ("CS", "NS"), "fla_gsa": ("CS",)}  # the others run all four
CROSS_TARGET, CROSS_BATCH = 512, 8
CROSS_SOURCES = (1024, 16384)  # the range of --lengths the cross patterns take as source lengths


def _randn(*shape, device, grad=True):
    return torch.randn(*shape, device=device, dtype=torch.bfloat16).requires_grad_(grad)


def _lengths(T, pattern):
    """(query length, key length) of a pattern at length T: T over T in self-attention,
    CROSS_TARGET over a source of T in cross-attention."""
    return (CROSS_TARGET if pattern[1] == "C" else T), T


# Each builder takes (B, T, device, pattern) and returns (forward callable -> tensor, leaf tensors).
def softmax_op(B, T, device, pattern="CS", forced: bool = True):
    """forced: SDPA's FlashAttention backend (CC: it or the memory-efficient one, which
    SDPA takes on a GPU, since there FlashAttention refuses is_causal where the query and
    key lengths differ); else the backend torch chooses."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    n, m = _lengths(T, pattern)
    q = _randn(B, HEADS, n, HEAD_DIM, device=device)
    k, v = (_randn(B, HEADS, m, HEAD_DIM, device=device) for _ in range(2))
    backends = [SDPBackend.FLASH_ATTENTION] + ([SDPBackend.EFFICIENT_ATTENTION] if pattern == "CC" else [])

    def fwd():
        with sdpa_kernel(backends) if forced else nullcontext():
            return F.scaled_dot_product_attention(q, k, v, is_causal=pattern[0] == "C")

    return fwd, [q, k, v]


def softmax_default_op(B, T, device, pattern="CS"):
    return softmax_op(B, T, device, pattern, forced=False)


_FLEX = {}


def local_op(B, T, device, pattern="CS"):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        # One compiled kernel per (B, T): past dynamo's default limit of 8 recompiles the
        # call would fall back to eager flex attention, which materialises T x T scores.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)

    def sliding_window(b, h, q_idx, kv_idx):
        if pattern == "NS":  # |t - j| <= window / 2, as the local block's noncausal window
            return (q_idx - kv_idx <= WINDOW // 2) & (kv_idx - q_idx <= WINDOW // 2)
        return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)

    mask = create_block_mask(sliding_window, None, None, T, T, device=device, _compile=True)  # no dense T x T mask
    q, k, v = (_randn(B, HEADS, T, HEAD_DIM, device=device) for _ in range(3))
    return (lambda: _FLEX["fn"](q, k, v, block_mask=mask)), [q, k, v]


def _orthonormal_basis(device):
    basis = torch.linalg.qr(torch.randn(HEADS, HEAD_DIM, RANK, device=device)).Q.transpose(1, 2)  # [H, r, d]
    return basis.contiguous().to(torch.bfloat16).requires_grad_(True)


def lavo_op(B, T, device, pattern="CS"):
    from lavo_tasks.kernels import lavo_attn

    n, m = _lengths(T, pattern)
    causal, cross = pattern[0] == "C", pattern[1] == "C"
    q = _randn(B, n, HEADS, HEAD_DIM, device=device)
    k, v = (_randn(B, m, HEADS, HEAD_DIM, device=device) for _ in range(2))
    basis = _orthonormal_basis(device)
    mem_bias = torch.zeros(HEADS, device=device, requires_grad=True)
    leaves = [q, k, v, basis, mem_bias]
    rel_bias = None
    if pattern != "NC":  # NC has no window
        rel_bias = torch.zeros(HEADS, WINDOW + (0 if causal else 1), device=device, requires_grad=True)
        leaves.append(rel_bias)
    fwd = lambda: lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=WINDOW, causal=causal, cross=cross)  # noqa: E731
    return fwd, leaves


def _gates(B, T, device):
    # log alpha = logsigmoid(f) / tau with tau = 8, as the GSA layer makes them
    f = torch.randn(B, T, HEADS, SLOTS, device=device)
    return (F.logsigmoid(f) / 8).requires_grad_(True)


def gsa_op(B, T, device, pattern="CS"):
    from lavo_tasks.kernels import gsa_attn

    n, m = _lengths(T, pattern)
    q = _randn(B, n, HEADS, HEAD_DIM, device=device)
    k, v = (_randn(B, m, HEADS, HEAD_DIM, device=device) for _ in range(2))
    log_alpha = _gates(B, m, device)
    options = dict(causal=pattern[0] == "C", cross=pattern[1] == "C")
    return (lambda: gsa_attn(q, k, v, log_alpha, **options)[0]), [q, k, v, log_alpha]


def fla_gsa_op(B, T, device, pattern="CS"):
    from fla.ops.gsa import chunk_gsa

    q, k, v = (_randn(B, T, HEADS, HEAD_DIM, device=device) for _ in range(3))
    log_alpha = _gates(B, T, device)

    def fwd():
        g = log_alpha.to(torch.bfloat16)
        s = 1 - g.float().exp()  # the write weight, as fla's own GSA layer computes it
        return chunk_gsa(q, k, v, s.to(torch.bfloat16), g)[0]

    return fwd, [q, k, v, log_alpha]


OPS: dict[str, Callable] = {
    "softmax": softmax_op,
    "softmax_default": softmax_default_op,
    "local": local_op,
    "lavo": lavo_op,
    "gsa": gsa_op,
    "fla_gsa": fla_gsa_op,
}


def measure(build: Callable, B: int, T: int, device, pattern: str = "CS") -> dict:
    """Median fwd and fwd+bwd milliseconds and peak fwd+bwd memory of one op at (B, T),
    and `graph_fwd_bwd_ms`: the fwd+bwd calls replayed back to back from one CUDA graph,
    with no host work between them (as in a `trainer.compile=reduce-overhead` step,
    roughly) and a warm L2 cache, where `do_bench` clears it before each call: the gap
    between the two is the host's time between kernels and the cold cache's. A capture
    that fails is recorded as `graph_error`, and the ops measured after it are not
    affected."""
    from triton.testing import do_bench, do_bench_cudagraph

    from .generation import RngStates

    torch.cuda.empty_cache()
    fwd, leaves = build(B, T, device, pattern)

    def fwd_bwd():
        fwd().float().sum().backward()

    fwd_bwd()  # compile / autotune outside the timings
    torch.cuda.synchronize()
    for t in leaves:
        t.grad = None
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    with torch.no_grad():
        fwd_ms = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    fwd_bwd_ms = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    row = {"fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "peak_mib": peak / 2**20}
    rng = RngStates(None)
    try:
        row["graph_fwd_bwd_ms"] = do_bench_cudagraph(fwd_bwd, grad_to_none=leaves, return_mode="median")
    except Exception as err:  # (torch.cuda.graph names what broke the capture)
        row["graph_error"] = f"{type(err).__name__}: {err}"[:300]
        rng.restore()  # else every later draw on the GPU, the next ops' inputs, raises
        torch.cuda.synchronize()
    return row


def decode_latency(name: str, context: int, device) -> dict:
    """Per-token latency of one attention decode step at batch 8 after `context` tokens,
    and the bytes of the state the step carries."""
    from triton.testing import do_bench

    B, H, D = DECODE_BATCH, HEADS, HEAD_DIM
    q, k, v = (torch.randn(B, H, D, device=device, dtype=torch.bfloat16) for _ in range(3))
    if name == "softmax":
        cache_k = torch.randn(B, H, context + 1, D, device=device, dtype=torch.bfloat16)
        cache_v = torch.randn_like(cache_k)

        def step():
            cache_k[:, :, context] = k
            cache_v[:, :, context] = v
            return F.scaled_dot_product_attention(q[:, :, None], cache_k, cache_v)

        state_bytes = 2 * cache_k[:, :, :context].numel() * cache_k.element_size()
    elif name == "lavo":
        from lavo_tasks.kernels import LavoDecodeState, lavo_decode_step

        basis = _orthonormal_basis(device).detach()
        rel_bias = torch.zeros(H, WINDOW, device=device)
        mem_bias = torch.zeros(H, device=device)
        state = LavoDecodeState.empty(B, H, D, RANK, WINDOW, device=device, dtype=torch.bfloat16)
        state.keys.normal_(), state.values.normal_(), state.mem_sum.normal_()
        state = state._replace(count=context)  # the step costs the same at any count: only the ring slot and 1/count change

        def step():
            return lavo_decode_step(q, k, v, basis, rel_bias, mem_bias, state, window=WINDOW)[0]

        state_bytes = sum(t.numel() * t.element_size() for t in (state.keys, state.values, state.mem_sum))
    elif name in ("gsa", "fla_gsa"):
        log_alpha = F.logsigmoid(torch.randn(B, H, SLOTS, device=device)) / 8
        hk = torch.randn(B, H, SLOTS, D, device=device)
        hv = torch.randn(B, H, SLOTS, D, device=device)
        if name == "gsa":
            from lavo_tasks.kernels import gsa_decode_step

            step = lambda: gsa_decode_step(q, k, v, log_alpha, (hk, hv))[0]  # noqa: E731
        else:
            from fla.ops.gsa import fused_recurrent_gsa

            g = log_alpha.to(torch.bfloat16)[:, None]
            s = (1 - log_alpha.exp()).to(torch.bfloat16)[:, None]
            hk_t = hk.transpose(-1, -2).contiguous()  # fla keeps K~ as [N, H, K, M]
            step = lambda: fused_recurrent_gsa(  # noqa: E731
                q[:, None], k[:, None], v[:, None], s, g, initial_state=(hk_t, hv), output_final_state=True
            )[0]
        state_bytes = (hk.numel() + hv.numel()) * 4
    else:
        raise ValueError(name)
    with torch.no_grad():
        step()
        ms = do_bench(step, warmup=25, rep=100, return_mode="median")
    kv_bytes = 2 * B * H * context * D * 2
    return {"decode_ms": ms, "state_mib": state_bytes / 2**20, "kv_cache_mib": kv_bytes / 2**20}


def available_ops(requested: list[str]) -> list[str]:
    ops = []
    for name in requested:
        if name == "fla_gsa" and importlib.util.find_spec("fla") is None:
            print("fla_gsa: flash-linear-attention is not installed; left out", file=sys.stderr)
            continue
        ops.append(name)
    return ops


def run(args) -> list[dict]:
    device = torch.device("cuda")
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "dtype": "bfloat16",
    }
    ops = available_ops(args.ops)
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "bench.jsonl").open("w")

    def record(row):
        row = {**meta, **row}
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k not in meta}
        print(json.dumps(shown), flush=True)

    for context in args.decode:
        for name in [n for n in ops if n not in ("local", "softmax_default")]:  # one SDPA decode
            try:
                record({"kind": "decode", "op": name, "B": DECODE_BATCH, "T": context, **decode_latency(name, context, device)})
            except Exception as err:
                record({"kind": "decode", "op": name, "B": DECODE_BATCH, "T": context, "error": f"{type(err).__name__}: {err}"[:300]})
    self_shapes = [(TOKENS_PER_STEP // T, T) for T in args.lengths] + ([(1, LONG)] if args.long else [])
    cross_shapes = [(CROSS_BATCH, T) for T in args.lengths if CROSS_SOURCES[0] <= T <= CROSS_SOURCES[1]]
    for pattern in args.patterns:
        for B, T in cross_shapes if pattern[1] == "C" else self_shapes:
            for name in [n for n in ops if pattern in OP_PATTERNS.get(n, PATTERNS)]:
                where = {"kind": "kernel", "op": name, "pattern": pattern, "B": B, "T": T}
                if pattern[1] == "C":
                    where["target"] = CROSS_TARGET
                try:
                    record({**where, **measure(OPS[name], B, T, device, pattern)})
                except Exception as err:  # an op that fails or runs out of memory is recorded, not fatal
                    record({**where, "error": f"{type(err).__name__}: {err}"[:300]})
                    torch.cuda.empty_cache()
    log.close()
    plot(rows, out / "bench.png")
    print(markdown_table(rows))
    return rows


def markdown_table(rows: list[dict]) -> str:
    from .bench_report import graphed

    kernel = [r for r in rows if r["kind"] == "kernel"]
    ops = list(dict.fromkeys(r["op"] for r in kernel))
    shapes = list(dict.fromkeys((r.get("pattern", "CS"), r["B"], r["T"]) for r in kernel))
    cell = {(r["op"], r.get("pattern", "CS"), r["B"], r["T"]): r for r in kernel}

    def fmt(r, key):
        return "error" if r is None or "error" in r else f"{r[key]:.2f}"

    lines = ["| pattern, B x T | " + " | ".join(f"{op} fwd / fwd+bwd [graphed] ms (peak MiB)" for op in ops) + " |",
             "|---" * (len(ops) + 1) + "|"]
    for pattern, B, T in shapes:
        cells = []
        for op in ops:
            r = cell.get((op, pattern, B, T))
            cells.append("-" if r is None and pattern not in OP_PATTERNS.get(op, PATTERNS)
                         else f"{fmt(r, 'fwd_ms')} / {fmt(r, 'fwd_bwd_ms')}{graphed(r or {})} ({fmt(r, 'peak_mib')})")
        shape = f"{B} x {CROSS_TARGET} over {T}" if pattern[1] == "C" else f"{B} x {T}"
        lines.append(f"| {pattern}, {shape} | " + " | ".join(cells) + " |")
    decode = [r for r in rows if r["kind"] == "decode"]
    if decode:
        lines += ["", "| decode, batch 8 | context | ms per token | state MiB | KV cache MiB |", "|---|---|---|---|---|"]
        for r in decode:
            if "error" in r:
                lines.append(f"| {r['op']} | {r['T']} | error | | |")
            else:
                lines.append(f"| {r['op']} | {r['T']} | {r['decode_ms']:.3f} | {r['state_mib']:.2f} | {r['kv_cache_mib']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernel = [r for r in rows if r["kind"] == "kernel" and "error" not in r and r["B"] * r["T"] == TOKENS_PER_STEP
              and r.get("pattern", "CS") == "CS"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for op in dict.fromkeys(r["op"] for r in kernel):
        pts = sorted((r["T"], r["fwd_bwd_ms"], r["peak_mib"]) for r in kernel if r["op"] == op)
        ax_t.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=op)
        ax_m.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=op)
    for ax, label in ((ax_t, "forward+backward ms (median)"), (ax_m, "peak forward+backward MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"sequence length T (batch = {TOKENS_PER_STEP} / T)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    gpu = rows[0]["gpu"] if rows else ""
    fig.suptitle(f"bf16, {HEADS} heads x {HEAD_DIM}, {gpu}, {rows[0]['date'] if rows else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m lavo_tasks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out", help="folder for bench.jsonl and bench.png")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="comma-separated T values (powers of two up to 65536)")
    p.add_argument("--ops", default=",".join(ALL_OPS), help=f"comma-separated subset of {','.join(ALL_OPS)}")
    p.add_argument("--no-long", dest="long", action="store_false", help="skip the B=1, T=128K run")
    p.add_argument("--decode", default=",".join(map(str, DECODE_CONTEXTS)),
                   help="comma-separated decode contexts ('' for none)")
    p.add_argument("--patterns", default="CS", help=f"comma-separated subset of {','.join(PATTERNS)}")
    args = p.parse_args(argv)
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
        args.decode = [int(x) for x in args.decode.split(",") if x]
    except ValueError:
        p.error("--lengths and --decode take comma-separated integers")
    for T in args.lengths:
        if T < 1 or TOKENS_PER_STEP % T or T & (T - 1):
            p.error(f"--lengths: {T} is not a power of two dividing {TOKENS_PER_STEP}")
    args.patterns = [x for x in args.patterns.split(",") if x]
    if not args.patterns or any(x not in PATTERNS for x in args.patterns):
        p.error(f"--patterns: {','.join(args.patterns) or 'none'}; allowed {','.join(PATTERNS)}")
    args.ops = [x for x in args.ops.split(",") if x]
    unknown = [x for x in args.ops if x not in OPS]
    if unknown:
        p.error(f"--ops: unknown {', '.join(unknown)}; allowed {', '.join(ALL_OPS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the benchmark needs a CUDA GPU (timings on a CPU mean nothing)", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
