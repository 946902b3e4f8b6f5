"""End-to-end benchmark: training throughput of the toolkit's language model, on one GPU.

    python -m lavo_tasks.bench_e2e [--out DIR] [--lengths 2048,8192,32768]
                                   [--attentions softmax,lavo,gsa] [--steps 10]

The protocol is the end-to-end part of docs/design.md §4: the LM of `task=lm`
with `model.preset=cab` (12 layers, width 768, 12 heads of 64, d_ff 3072; dropout off),
a 32,000-token vocabulary, 32,768 tokens per training step (batch = 32768 / T), one step
= forward + backward + fused AdamW under bf16 autocast. lavo runs with window 128 and
rank 64, gsa with 64 slots (the kernel benchmark's sizes). Random tokens: throughput does
not depend on the text. After warm-up steps (compiles, autotuning), `--steps` steps are
timed between two device synchronisations; tokens/s = steps * 32768 / seconds.

Writes DIR/bench_e2e.jsonl and prints a Markdown table. Needs CUDA.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lavo_tasks.config import compose, site_attention
from lavo_tasks.tasks.lm.model import LanguageModel

VOCAB = 32000
TOKENS_PER_STEP = 32768
LENGTHS = (2048, 8192, 32768)
ATTENTIONS = ("softmax", "lavo", "gsa")
WARMUP_STEPS = 3
# the attention sizes of the kernel benchmark (the YAML defaults are sized for CPU runs)
ATTENTION_OVERRIDES = {"lavo": ["attention.window=128", "attention.rank=64"], "gsa": ["attention.slots=64"]}


def build_model(attention: str, extra: list[str] = ()) -> LanguageModel:
    """The benchmark's LM: `task=lm model.preset=cab`, dropout off, then `extra` overrides."""
    cfg = compose(["task=lm", f"attention={attention}", "model.preset=cab", "model.dropout=0.0",
                   *ATTENTION_OVERRIDES.get(attention, []), *extra])
    return LanguageModel(VOCAB, cfg.model, site_attention(cfg, "attention"))


def training_throughput(model: LanguageModel, T: int, steps: int, tokens_per_step: int = TOKENS_PER_STEP) -> dict:
    """Tokens per second of `steps` training steps at length T (after WARMUP_STEPS), and
    the peak memory of a step. The model's device is where it runs."""
    device = next(model.parameters()).device
    batch = max(1, tokens_per_step // T)
    tokens = torch.randint(VOCAB, (batch, T + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    on_gpu = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=on_gpu)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step():
        with autocast:
            logits, _ = model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(WARMUP_STEPS):
        step()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss = float(loss)  # waits for the last step
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    row = {"B": batch, "T": T, "tokens_per_s": steps * batch * T / seconds, "step_ms": seconds / steps * 1e3,
           "loss": loss}
    if on_gpu:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def markdown_table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["attention"] for r in rows))
    lines = ["| T | " + " | ".join(f"{n} tokens/s (step ms)" for n in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    for T in sorted({r["T"] for r in rows}):
        cells = []
        for n in names:
            r = next((r for r in rows if r["T"] == T and r["attention"] == n), None)
            if r is None or "error" in r:
                cells.append(r["error"][:40] if r else "")
            else:
                cells.append(f"{r['tokens_per_s'] / 1e3:.0f}K ({r['step_ms']:.0f})")
        lines.append(f"| {T} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lavo_tasks.bench_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out", help="folder for bench_e2e.jsonl")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated T values")
    p.add_argument("--attentions", default=",".join(ATTENTIONS), help=f"comma-separated subset of {','.join(ATTENTIONS)}")
    p.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x]
    except ValueError:
        p.error("--lengths takes comma-separated integers")
    bad = [T for T in lengths if T < 1 or TOKENS_PER_STEP % T]
    if bad:
        p.error(f"--lengths: {bad[0]} does not divide {TOKENS_PER_STEP}")
    attentions = [x for x in args.attentions.split(",") if x]
    unknown = [x for x in attentions if x not in ATTENTIONS]
    if unknown:
        p.error(f"--attentions: unknown {', '.join(unknown)}; allowed {', '.join(ATTENTIONS)}")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if not torch.cuda.is_available():
        print("error: the benchmark needs a CUDA GPU (timings on a CPU mean nothing)", file=sys.stderr)
        return 2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "vocab": VOCAB, "tokens_per_step": TOKENS_PER_STEP}
    rows = []
    with (out / "bench_e2e.jsonl").open("w") as log:
        for name in attentions:
            model = build_model(name).cuda()
            for T in lengths:
                try:
                    row = {"attention": name, **training_throughput(model, T, args.steps)}
                except torch.OutOfMemoryError as err:  # recorded, not fatal
                    row = {"attention": name, "T": T, "error": f"out of memory: {err}"[:200]}
                torch.cuda.empty_cache()
                rows.append(row)
                log.write(json.dumps({**meta, **row}) + "\n")
                log.flush()
                print(json.dumps(row), flush=True)
            del model
            torch.cuda.empty_cache()
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
