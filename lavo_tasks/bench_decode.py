"""Decode benchmark: generation per token of a task's model at its `cab` preset, every
attention side by side in one process, eager and captured (CUDA graphs), on one GPU.

    python -m lavo_tasks.bench_decode task=lm|summarization|tts [attentions=softmax,local,lavo,gsa]
        [contexts=4096] [beams=1] [tokens=256] [modes=eager,graph] [out=bench_out] [commit=ID]
        [KEY=VALUE ...]

The models are the tasks' own (bench_e2e's configuration: model.preset=cab, its
attention sizes, a cross site `local` cannot serve keeps softmax), random weights, one
sequence, bf16 autocast. `contexts`: what the decode starts from, in tokens: lm, the
prompt; summarization, the source; tts, the text. `beams` applies to summarization
(lm and tts decode greedily). No end token: every run decodes its full length.

The context is read once (lm: the prompt but its last token prefilled; summarization
and tts: the source or text encoded) into a decode state; each run is `generate`
(`generate_frames` for tts) from that state, and the per-token figures are differences
between a long run and one of 8 tokens, so the capture and the first token cancel:
ms/token wall (perf_counter between synchronisations, runs of `tokens` + 8 tokens, each
the fastest of 3 after one untimed call: the capture's host time varies by tens of ms
from call to call, so `tokens` must be long enough to drown it), GPU ms/token and
kernels/token (torch.profiler over runs of 32 + 8 tokens: kernel times barely vary, and
profiling a long run costs more than the run). Memory, above what was allocated before the context
was read (the weights): `state` (the decode state's tensors: KV caches, prepared
sources, constant-size states), `decode peak` (the CUDA allocator's peak during the
long run, the state included) and `prepare peak` (the peak while reading the context:
encoder or prefill). `commit` names the code measured (bench_e2e's rule: by default the
git checkout's short hash, "unknown" for an installed copy). Writes
OUT/bench_decode_<task>.jsonl and prints a Markdown table. Needs CUDA.
"""

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from . import tasks
from .attention import ATTENTION_NAMES
from .bench_e2e import bench_config, checkout_commit, fastest_seconds, record
from .config import split_args
from .errors import ConfigError
from .generation import _leaves, generate, generate_frames
from .run.cli import run_cli

TASKS = ("lm", "summarization", "tts")
MODES = {"eager": False, "graph": True}
SHORT = 8  # tokens of the short run whose figures are subtracted
REPEATS = 3  # timed calls of each run, the fastest kept (the capture's host time varies)
# The lm cab preset's context (8,192) makes the default corpus's test split too short for
# the DataModule's check; the spec (the vocabulary) does not depend on it, nor the model.
DATA_OVERRIDES = {"lm": ["data.seq_len=1024"]}
PROFILED = 32  # tokens of the profiled long run
ARGUMENTS = {"attentions": ",".join(ATTENTION_NAMES), "contexts": "4096", "beams": "1", "tokens": "256",
             "modes": "eager,graph", "out": "bench_out", "commit": ""}


def _numbers(key: str, text: str) -> list[int]:
    values = [v for v in text.split(",") if v]
    if not values or not all(v.isdigit() and int(v) >= 1 for v in values):
        raise ConfigError(f"{key}={text!r}: whole numbers >= 1, comma-separated")
    return [int(v) for v in values]


def decode_run(task: str, model, context: int, beam: int, device: torch.device, positions: int):
    """(prepare, run) under bf16 autocast: prepare() reads a random context of `context`
    tokens (lm: the prompt but its last token, prefilled; summarization: the source,
    encoded, for a decode of at most `positions` target positions, as `summarize` asks;
    tts: the text, encoded) and returns the decode state; run(state, n,
    cuda_graph) decodes n tokens (frames) from it (lm: from the prompt's last token)."""
    g = torch.Generator(device=device).manual_seed(0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    if task == "lm":
        prompt = torch.randint(2, model.embed.num_embeddings, (1, context), device=device, generator=g)

        def prepare():
            with autocast, torch.no_grad():
                return model(prompt[:, :-1], model.init_state(1))[1]

        def run(state, n, cuda_graph):
            with autocast:
                generate(model, state, prompt[:, -1:], max_len=n, cuda_graph=cuda_graph)
    elif task == "summarization":
        source = torch.randint(2, model.embed.num_embeddings, (1, context), device=device, generator=g)
        prefix = torch.ones(1, 1, dtype=torch.long, device=device)

        def prepare():
            with autocast, torch.no_grad():
                return model.init_state(source, positions=positions)

        def run(state, n, cuda_graph):
            with autocast:
                generate(model.step, state, prefix, max_len=n, beam=beam, max_positions=positions, cuda_graph=cuda_graph)
    else:
        text = torch.randint(1, model.embedding.num_embeddings, (1, context), device=device, generator=g)
        lengths = torch.tensor([context], device=device)
        start = torch.zeros(1, 1, model.n_mels, device=device)

        def prepare():
            with autocast, torch.no_grad():
                return model.init_state(text, lengths)

        def run(state, n, cuda_graph):
            with autocast:
                generate_frames(model.step, state, start, max_steps=n, stop_threshold=1.0,
                                feedback=model.last_frame, cuda_graph=cuda_graph)
    return prepare, run


def state_bytes(state) -> int:
    """Bytes of the distinct storages behind the tensors of a decode state."""
    storages = {}
    for leaf in _leaves(state):
        if isinstance(leaf, torch.Tensor):
            storage = leaf.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _kernels(run) -> tuple[int, float]:
    """(kernels launched, their total GPU ms) while run() runs."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.time_range.elapsed_us() for e in kernels) / 1e3


def measure(prepare, run, tokens: int, cuda_graph: bool) -> dict:
    """Per-token figures of decode_run's (prepare, run): long run minus short run, from
    one prepared state; the memory above the weights (what was allocated before prepare)."""
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    state = prepare()
    torch.cuda.synchronize()
    prepare_peak = torch.cuda.max_memory_allocated() - weights

    def short():
        run(state, SHORT, cuda_graph)

    def long():
        run(state, SHORT + tokens, cuda_graph)

    def profiled():
        run(state, SHORT + PROFILED, cuda_graph)

    short(), long(), profiled()  # compiles, autotunes, library plans for every length
    wall = (fastest_seconds(long, REPEATS) - fastest_seconds(short, REPEATS)) / tokens
    (k_long, gpu_long), (k_short, gpu_short) = _kernels(profiled), _kernels(short)
    torch.cuda.reset_peak_memory_stats()
    long()
    decode_peak = torch.cuda.max_memory_allocated() - weights
    return {"wall_ms": wall * 1e3, "gpu_ms": (gpu_long - gpu_short) / PROFILED,
            "kernels": (k_long - k_short) / PROFILED, "state_gib": state_bytes(state) / 2**30,
            "peak_gib": decode_peak / 2**30, "prepare_peak_gib": prepare_peak / 2**30}


def markdown_table(task: str, rows: list[dict]) -> str:
    lines = [f"### bench_decode: {task} (bf16 autocast, one sequence)", "",
             "| attention | context | beam | mode | wall ms/token | GPU ms/token | wall/GPU | kernels/token | "
             "state GiB | decode peak GiB | prepare peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['attention']} | {r['context']} | {r['beam']} | {r['mode']} | {r['error']} |||||||")
            continue
        lines.append(f"| {r['attention']} | {r['context']} | {r['beam']} | {r['mode']} | {r['wall_ms']:.3f} | "
                     f"{r['gpu_ms']:.3f} | {r['wall_ms'] / max(r['gpu_ms'], 1e-9):.2f} | {r['kernels']:.0f} | "
                     f"{r['state_gib']:.3f} | {r['peak_gib']:.3f} | {r['prepare_peak_gib']:.3f} |")
    return "\n".join(lines)


def bench(args: list[str]) -> list[dict]:
    """Runs the benchmark for the command's arguments; returns its rows."""
    selectors, overrides = split_args(args)
    task = selectors.pop("task", None)
    if task not in TASKS:
        raise ConfigError(f"task={task}: bench_decode takes task={'|'.join(TASKS)}")
    if selectors:
        raise ConfigError(f"{next(iter(selectors))}=: bench_decode chooses the attentions with attentions=A,B,...")
    options, extra = dict(ARGUMENTS), []
    for key, value in overrides:
        if key in options:
            options[key] = value
        else:
            extra.append(f"{key}={value}")
    attentions = [a for a in options["attentions"].split(",") if a]
    if not attentions or any(a not in ATTENTION_NAMES for a in attentions):
        raise ConfigError(f"attentions={options['attentions']!r}: choose from {', '.join(ATTENTION_NAMES)}")
    modes = [m for m in options["modes"].split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"modes={options['modes']!r}: choose from {', '.join(MODES)}")
    contexts, beams = _numbers("contexts", options["contexts"]), _numbers("beams", options["beams"])
    tokens = _numbers("tokens", options["tokens"])[0]
    if task != "summarization" and beams != [1]:
        raise ConfigError(f"beams={options['beams']!r}: only summarization decodes with beam search here")
    if not torch.cuda.is_available():
        raise ConfigError("bench_decode needs a CUDA GPU (timings on a CPU mean nothing)")
    extra = DATA_OVERRIDES.get(task, []) + extra
    if not any(key == "run.dir" for key, _ in overrides):
        extra.append(f"run.dir={Path(options['out']) / 'runs' / task}")
    configs = {a: bench_config(task, a, extra)[0] for a in attentions}  # every config checked before any work
    device = torch.device("cuda")
    torch.set_float32_matmul_precision("high")
    spec = tasks.load_task(task).DataModule(next(iter(configs.values()))).spec()  # the same for every attention
    out = Path(options["out"])
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "task": task, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "tokens": tokens, "overrides": extra,
            "commit": options["commit"] or checkout_commit()}
    rows = []
    with (out / f"bench_decode_{task}.jsonl").open("w") as log:
        for name, cfg in configs.items():
            model = tasks.load_task(task).Module(cfg, spec).model.to(device).eval()
            for context in contexts:
                for beam in beams:
                    prepare, run = decode_run(task, model, context, beam, device, 1 + SHORT + max(tokens, PROFILED))
                    for mode in modes:
                        rows.append(record({"attention": name, "context": context, "beam": beam, "mode": mode},
                                           log, meta, lambda: measure(prepare, run, tokens, MODES[mode])))
            del model
            torch.cuda.empty_cache()
    print(markdown_table(task, rows))
    return rows


def usage(argv=None) -> str:
    return __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> int:
    return run_cli(bench, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
