"""Summarizer throughput and decoding cost at the cab preset's sizes, random weights and tokens.

    python benchmarks/summarization.py OUT_DIR [--train-steps N] [--attentions softmax,local,lavo,gsa]

Two measurements per attention (every site the same attention; `local`, which has no
cross pattern, takes softmax cross-attention), the model built from
configs/task/summarization.yaml with `model.preset=cab` (6 + 6 layers, d=512, 8 heads,
CC cross-attention), on one CUDA device:
- training: AdamW steps under bf16 autocast on batches of source 4,096 / target 400
  random tokens (vocabulary VOCAB, a Multi-News-sized BPE): tokens/s (source + target
  tokens per second, after WARMUP_STEPS untimed steps) and peak allocated memory;
- decoding: beam search (beam 4, min_len = max_len = 400, so every summary has 400
  tokens) through the decode states for one source of 4,096 and of 16,384 tokens:
  seconds per summary (the source encoded once inside) and peak allocated memory.
Random weights time the same work as trained ones, but a trained model's beams may end
early; here none does. Writes OUT_DIR/summarization_bench.json and .md atomically.
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lavo_tasks.config import compose, site_attention
from lavo_tasks.files import write_atomically
from lavo_tasks.generation import generate
from lavo_tasks.tasks.summarization.model import Summarizer

VOCAB = 32768
BATCH = 4
WARMUP_STEPS = 5
DECODE_SOURCES = (4096, 16384)
BEAM = 4


def build(attention: str) -> tuple[Summarizer, dict]:
    args = ["task=summarization", "model.preset=cab", f"attention={attention}"]
    if attention == "local":
        args.append("model.cross_attention=softmax")
    cfg = compose(args)
    m = cfg.model
    model = Summarizer(VOCAB, d_model=m.d_model, n_heads=m.n_heads, encoder_layers=m.encoder_layers,
                       decoder_layers=m.decoder_layers, d_ff=m.d_ff, dropout=m.dropout,
                       encoder_attention=site_attention(cfg, "encoder_attention"),
                       decoder_attention=site_attention(cfg, "decoder_attention"),
                       cross_attention=site_attention(cfg, "cross_attention"), cross_causal=m.cross_causal)
    return model.cuda(), {"source": cfg.data.max_source_len, "target": cfg.data.max_target_len,
                          "lr": cfg.optim.lr, "label_smoothing": cfg.loss.label_smoothing}


def train_rate(attention: str, steps: int) -> dict:
    torch.manual_seed(0)
    model, sizes = build(attention)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=sizes["lr"])
    source = torch.randint(0, VOCAB, (BATCH, sizes["source"]), device="cuda")
    target = torch.randint(0, VOCAB, (BATCH, sizes["target"]), device="cuda")
    decoder_input = torch.cat([target.new_zeros(BATCH, 1), target[:, :-1]], dim=1)
    torch.cuda.reset_peak_memory_stats()
    for i in range(WARMUP_STEPS + steps):
        if i == WARMUP_STEPS:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(source, decoder_input)  # [B, T, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), label_smoothing=sizes["label_smoothing"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = steps * BATCH * (sizes["source"] + sizes["target"])
    return {"steps": steps, "batch": BATCH, "source_len": sizes["source"], "target_len": sizes["target"],
            "tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / steps,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "final_loss": float(loss)}


@torch.no_grad()
def decode_cost(attention: str, source_len: int, summary_len: int) -> dict:
    torch.manual_seed(0)
    model, _ = build(attention)
    model.eval()
    source = torch.randint(1, VOCAB, (1, source_len), device="cuda")
    prefix = torch.zeros(1, 1, dtype=torch.long, device="cuda")

    def once():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return generate(model.step, model.init_state(source), prefix, max_len=summary_len, min_len=summary_len,
                            eos_id=0, pad_id=0, beam=BEAM)

    once()  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = once()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"source_len": source_len, "summary_len": int(out.lengths[0]), "beam": BEAM, "s_per_summary": seconds,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_above_weights_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}


def markdown(results: dict) -> str:
    lines = [f"# Summarizer at model.preset=cab on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
             f"Training: bf16 autocast, AdamW, batch {BATCH}, source 4,096 + target 400 random tokens, vocabulary {VOCAB}.",
             "", "| attention | steps | ms/step | tokens/s | peak GiB |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if "train" in r:
            t = r["train"]
            lines.append(f"| {name} | {t['steps']} | {t['ms_per_step']:.1f} | {t['tokens_per_s']:,.0f} | {t['peak_gib']:.2f} |")
    lines += ["", f"Beam search (beam {BEAM}, 400 tokens, bf16 autocast), one summary:", "",
              "| attention | source | s / summary | peak GiB | peak above weights GiB |", "|---|---|---|---|---|"]
    for name, r in results.items():
        for d in r.get("decode", []):
            lines.append(f"| {name} | {d['source_len']:,} | {d['s_per_summary']:.2f} | {d['peak_gib']:.2f} | "
                         f"{d['peak_above_weights_gib']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--attentions", default="softmax,local,lavo,gsa")
    parser.add_argument("--decode-attentions", default="softmax,lavo,gsa")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {}

    def save():
        payload = json.dumps(results, indent=2).encode()
        write_atomically(args.out / "summarization_bench.json", lambda f: f.write(payload))
        text = markdown(results).encode()
        write_atomically(args.out / "summarization_bench.md", lambda f: f.write(text))

    for name in args.attentions.split(","):
        results.setdefault(name, {})["train"] = train_rate(name, args.train_steps)
        print(name, results[name]["train"], flush=True)
        torch.cuda.empty_cache()
        save()
    for name in args.decode_attentions.split(","):
        for source_len in DECODE_SOURCES:
            results.setdefault(name, {}).setdefault("decode", []).append(decode_cost(name, source_len, 400))
            print(name, results[name]["decode"][-1], flush=True)
            torch.cuda.empty_cache()
            save()


if __name__ == "__main__":
    main()
