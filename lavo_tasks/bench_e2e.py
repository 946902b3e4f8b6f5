"""End-to-end benchmark: training throughput of a task's model at its `cab` preset, for
each attention side by side in one process, on one GPU.

    python -m lavo_tasks.bench_e2e task=NAME [attentions=softmax,local,lavo,gsa] [steps=10]
                                   [compile=off|default|max-autotune|reduce-overhead]
                                   [commit=ID] [out=bench_out] [batch=FILE] [--profile] [KEY=VALUE ...]
    python -m lavo_tasks.bench_e2e task=NAME save_batch=FILE [compile=...] [KEY=VALUE ...]

For each attention: the run's configuration (`task=NAME attention=A model.preset=cab`,
the kernel benchmark's attention sizes: lavo window 128 rank 64, gsa 64 slots, then the
KEY=VALUE overrides; run.dir, where the default data and caches are written, is
OUT/runs/<task> unless given), its DataModule's spec and first training batch (the
task's default data unless data.path says otherwise; throughput does not depend on the
values), its Module; one step = the Module's own `training_step` + backward + fused
AdamW, under bf16 autocast on a GPU. After WARMUP_STEPS (compiles, autotuning), `steps`
steps are timed between two device synchronisations, TIMED_WINDOWS times; the fastest
window counts. A row: samples/s (the batch's samples), tokens/s (the sequence positions
the model's Encoder and Decoder stacks read per step, padding included: for an
encoder-decoder both sequences), step ms (wall), and on a GPU: the GPU's kernel time per
step (gpu ms: the device time of every kernel and copy that torch.profiler records over
PROFILED_STEPS more steps; wall / gpu near 1 means the GPU is busy the whole step, far
above 1 that the host holds it back), the host syncs of one step (operations that wait
for the GPU, counted by torch.cuda.set_sync_debug_mode("warn")), peak memory of a step
(GiB), and the parameter count; with `compile=reduce-overhead`, `cudagraph_skips`: the
compiled graphs that Inductor ran without CUDA graphs during the warm-up (each launches
its kernels from the host at every step; `TORCH_LOGS=cudagraphs` prints why). `compile`
compiles the task's model (`lavo_tasks.compiling.compile_model`) and sets
`trainer.compile` to the same mode, whose tasks pad their batches to a few fixed
lengths, as a compiled training run does, and each attention compiles from a clean slate
(`torch._dynamo.reset()` after each: no graphs or CUDA graph pools of the one before
it); `--profile` writes, per attention, the top kernels of the profiled steps by GPU
time, their top ops by host time (where wall time beyond the GPU's goes) and the source
line of each host sync to OUT/profile_<task>_<attention>.txt. `commit` names the code
measured in every row (docs/benchmarks.md keeps one line per commit, so a change's
before and after stand side by side); by default the short hash of the git checkout the
package runs from, or "unknown" for an installed copy. A site whose pattern the
attention cannot run (`local` at a cross-attention site) keeps softmax, and the row says
so (`cross: softmax`). An attention that runs out of memory gets a row with its error.

`save_batch=FILE` writes the spec and the first training batch of the configuration
(what a row measures the step on) to FILE and times nothing (on any machine);
`batch=FILE` then takes them from FILE instead of the task's DataModule. A GPU machine
that lacks what reads a task's data (pcc's open3d) measures the task that way, the file
written where the data can be read. The batch's shapes follow the data.* keys, `seed`
and whether `compile` is off (a compiled model's tasks pad some batches, alike in every
mode): the file keeps them, `batch=` refuses a file written with others, and each row
records them (`batch_settings`). A batch for `compile=reduce-overhead`, which a machine
without a GPU refuses, is written there with `compile=default`.

Writes OUT/bench_e2e_<task>.jsonl and prints a Markdown table. Needs CUDA (tests run
it on the CPU with `allow_cpu`).
"""

import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.pytorch.utilities import move_data_to_device
from lightning.pytorch.utilities.data import extract_batch_size
from torch._dynamo.utils import counters

from . import tasks
from .attention import ATTENTION_NAMES, block_class
from .config import compose, split_args, validate
from .errors import ConfigError
from .files import write_atomically
from .compiling import COMPILE_MODES, compile_model
from .run.cli import run_cli
from .stacks import Decoder, Encoder

WARMUP_STEPS = 3
# Timed windows of `steps` steps; a row keeps the fastest. The GPU machine's host is
# shared, and a host-bound step's wall time moves with its load by 10-40% from run to run.
TIMED_WINDOWS = 3
# the attention sizes of the kernel benchmark (the YAML defaults are sized for CPU runs)
ATTENTION_OVERRIDES = {"lavo": ["attention.window=128", "attention.rank=64"], "gsa": ["attention.slots=64"]}
CROSS_FALLBACK = "softmax"  # at a site whose pattern the attention cannot run (local at cross sites)
ARGUMENTS = {"attentions": ",".join(ATTENTION_NAMES), "steps": "10", "out": "bench_out", "compile": "off",
             "commit": "", "batch": "", "save_batch": ""}
PROFILED_STEPS = 3
TOP_KERNELS = 25  # rows of a --profile table


def bench_config(task: str, attention: str, extra: list[str] = ()):
    """The benchmark's validated configuration of `task` with `attention` at every site it can serve."""
    patterns = block_class(attention).patterns
    cross = [f"model.{site}={CROSS_FALLBACK}" for site, pattern in tasks.load_task(task).sites.items()
             if pattern not in patterns]
    cfg = compose([f"task={task}", f"attention={attention}", "model.preset=cab",
                   *ATTENTION_OVERRIDES.get(attention, []), *cross, *extra])
    validate(cfg)
    return cfg, bool(cross)


class TokenCount:
    """Sums B * T of the inputs [B, T, D] of every Encoder / Decoder stack of `model`.
    Only around an eager model: Dynamo traces a compiled model's hooks and guards on the
    running sum, an int that changes at every call, so every step would compile again."""

    def __init__(self, model: torch.nn.Module):
        self.tokens = 0
        self.handles = [m.register_forward_pre_hook(self._count) for m in model.modules()
                        if isinstance(m, (Encoder, Decoder))]
        if not self.handles:
            raise ValueError(f"{type(model).__name__} has no lavo_tasks.stacks Encoder or Decoder to count tokens at")

    def _count(self, module, args) -> None:
        x = args[0]
        self.tokens += x.shape[0] * x.shape[1]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def spec_and_first_batch(cfg) -> dict:
    """{"task", "spec", "batch"}: the task's DataModule's spec and first training batch."""
    datamodule = tasks.load_task(cfg.task).DataModule(cfg)
    return {"task": cfg.task, "spec": datamodule.spec(), "batch": next(iter(datamodule.train_dataloader()))}


def batch_settings(overrides: list[str]) -> list[str]:
    """Those of the KEY=VALUE `overrides` that can change a task's first training batch.
    Of `trainer.compile` only whether it is off counts, kept as `trainer.compile!=off`:
    every compiled mode pads the batches alike (lavo_tasks.data)."""
    settings = [o for o in overrides if o.startswith(("data.", "seed="))]
    if any(o.startswith("trainer.compile=") and o != "trainer.compile=off" for o in overrides):
        settings.append("trainer.compile!=off")
    return sorted(settings)


def save_batch(cfg, settings: list[str], path: Path) -> None:
    """`spec_and_first_batch` of cfg and its `batch_settings`, written to path (atomically)."""
    saved = {**spec_and_first_batch(cfg), "settings": settings}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: torch.save(saved, f))
    except OSError as error:
        raise ConfigError(f"save_batch={path}: {error.strerror or error}") from None


def load_batch(path: Path, task: str, settings: list[str]) -> dict:
    """What `save_batch` wrote to path, for `task` with these `batch_settings`; ConfigError
    naming the file otherwise."""
    try:
        saved = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"batch={path}: no such file (write it with save_batch={path})") from None
    except Exception as error:  # (torch.load's errors name neither the file nor what it expected)
        raise ConfigError(f"batch={path}: not a file that save_batch= wrote ({type(error).__name__})") from None
    if not isinstance(saved, dict) or set(saved) != {"task", "spec", "batch", "settings"}:
        raise ConfigError(f"batch={path}: not a file that save_batch= wrote")
    if saved["task"] != task:
        raise ConfigError(f"batch={path}: written for task={saved['task']}, not task={task}")
    if saved["settings"] != settings:
        raise ConfigError(f"batch={path}: written with {' '.join(saved['settings']) or 'no data keys'}, "
                          f"not {' '.join(settings) or 'no data keys'}")
    return saved


def module_and_first_batch(cfg, saved: dict | None = None):
    """The task's Module (on the CPU) and the first training batch: its DataModule's, or
    the one in `saved` (`load_batch`) with the spec saved beside it."""
    saved = saved or spec_and_first_batch(cfg)
    return tasks.load_task(cfg.task).Module(cfg, saved["spec"]), saved["batch"]


def training_step(module, batch, optimizer, autocast) -> torch.Tensor:
    """One step as a training run takes it, without Lightning's loop: the Module's
    `training_step` under `autocast`, backward, the optimizer's step; the loss, detached."""
    with autocast:
        loss = module.training_step(batch, 0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def training_throughput(cfg, steps: int, device: torch.device, compile_mode: str = "off",
                        profile_path: Path | None = None, saved: dict | None = None) -> dict:
    """Samples/s, tokens/s, step ms, GPU ms and host syncs per step, peak GiB (CUDA) and
    loss of `steps` training steps of the task's Module on the first batch of its
    DataModule (or `saved`'s), after WARMUP_STEPS; `profile_path`: where the top kernels go."""
    module, batch = module_and_first_batch(cfg, saved)
    module, batch = module.to(device), move_data_to_device(batch, device)
    on_gpu = device.type == "cuda"
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=on_gpu)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu)
    module.train()
    counter = TokenCount(module)
    with warnings.catch_warnings(), torch.no_grad(), autocast:  # one eager forward, before compiling
        warnings.filterwarnings("ignore", message=".*self.log.*")
        module.training_step(batch, 0)
    counter.remove()
    tokens_per_step = counter.tokens
    if compile_mode != "off":
        compile_model(module.model, compile_mode)

    def step():
        return training_step(module, batch, optimizer, autocast)

    skips_before = counters["inductor"]["cudagraph_skips"]
    with warnings.catch_warnings():  # the Module logs train_loss; no Trainer is here to take it
        warnings.filterwarnings("ignore", message=".*self.log.*")
        for _ in range(WARMUP_STEPS):
            step()
        cudagraph_skips = counters["inductor"]["cudagraph_skips"] - skips_before
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        losses = []

        def window():
            for _ in range(steps):
                loss = step()
            losses.append(float(loss))  # waits for the last step

        seconds = fastest_seconds(window, TIMED_WINDOWS)
        loss = losses[-1]
        samples = extract_batch_size(batch)
        row = {"batch": samples, "samples_per_s": steps * samples / seconds,
               "tokens_per_s": steps * tokens_per_step / seconds, "tokens_per_step": tokens_per_step,
               "step_ms": seconds / steps * 1e3, "timed_windows": TIMED_WINDOWS, "loss": loss,
               "params": sum(p.numel() for p in module.parameters())}
        if compile_mode == "reduce-overhead":
            row["cudagraph_skips"] = cudagraph_skips
        if on_gpu:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            syncs = host_syncs(step)
            row["syncs_per_step"] = len(syncs)
            row["gpu_ms"] = gpu_ms_per_step(step, profile_path)
            if profile_path is not None:
                with profile_path.open("a") as out:
                    out.write("host syncs of one step (the Python line that called the op):\n"
                              + "".join(f"  {place}\n" for place in syncs))
    return row


def fastest_seconds(run, repeats: int) -> float:
    """The fastest of `repeats` calls of run(), each timed between two device
    synchronisations (on a GPU). Shared by the benchmarks of this package: the GPU
    machine's host is shared, and host-bound times move with its load."""
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def host_syncs(step) -> list[str]:
    """The operations of one call of `step` that synchronise the host with the GPU, as
    "file:line" of the Python line that called each (the warning's place)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A process's first switch into "warn" and back reports one sync of its own, at
        # set_sync_debug_mode's line, even around a step that does nothing (torch 2.11, on
        # an H100); the later ones do not. So one empty switch first, its warnings dropped.
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.set_sync_debug_mode("default")
        del caught[:]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def gpu_ms_per_step(step, profile_path: Path | None) -> float:
    """The device time of the kernels (and copies) of PROFILED_STEPS calls of `step`, per
    call, from torch.profiler; `profile_path`: write the top TOP_KERNELS there."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
    if profile_path is not None:
        kernels = events.table(sort_by="self_device_time_total", row_limit=TOP_KERNELS)
        host = events.table(sort_by="self_cpu_time_total", row_limit=TOP_KERNELS)
        profile_path.write_text(f"{PROFILED_STEPS} steps, GPU time per step {device_us / PROFILED_STEPS / 1e3:.2f} "
                                f"ms\n\nby GPU time:\n{kernels}\n\nby host time (where a step's wall time "
                                f"beyond its GPU time goes):\n{host}\n")
    return device_us / PROFILED_STEPS / 1e3


def record(row: dict, log, meta: dict, measure: Callable[[], dict]) -> dict:
    """`row` with `measure()`'s figures (an out-of-memory error is recorded in the row, not
    raised), after freeing the allocator's cache; written to the JSONL `log` with `meta`
    and printed. Shared by the benchmarks of this package."""
    try:
        row |= measure()
    except torch.OutOfMemoryError as err:
        row["error"] = f"out of memory: {err}"[:200]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    log.write(json.dumps({**meta, **row}) + "\n")
    log.flush()
    print(json.dumps(row), flush=True)
    return row


def checkout_commit() -> str:
    """The short hash of the git checkout this package runs from; "unknown" outside one."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def markdown_table(task: str, rows: list[dict]) -> str:
    lines = [f"| {task}: attention | samples/s | tokens/s | step ms | gpu ms | wall / gpu | syncs / step "
             "| peak GiB | params |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["attention"] + (f" (cross: {CROSS_FALLBACK})" if r.get("cross_fallback") else "")
        if "error" in r:
            lines.append(f"| {name} | {r['error'][:60]} | | | | | | | |")
            continue
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        gpu = f"{r['gpu_ms']:.1f} | {r['step_ms'] / r['gpu_ms']:.2f}" if r.get("gpu_ms") else "- | -"
        syncs = r.get("syncs_per_step", "-")
        lines.append(f"| {name} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | "
                     f"{gpu} | {syncs} | {peak} | {r['params'] / 1e6:.1f}M |")
    return "\n".join(lines)


def bench(args: list[str], allow_cpu: bool = False) -> list[dict]:
    """Runs the benchmark for the command's arguments; returns its rows."""
    profile = "--profile" in args
    selectors, overrides = split_args([a for a in args if a != "--profile"])
    task = selectors.pop("task", None)
    if task is None:
        raise ConfigError("bench_e2e: name the task, e.g. task=lm")
    if selectors:
        raise ConfigError(f"{next(iter(selectors))}=: bench_e2e chooses the attentions with attentions=A,B,...")
    options = dict(ARGUMENTS)
    extra = []
    for key, value in overrides:
        if key in options:
            options[key] = value
        else:
            extra.append(f"{key}={value}")
    attentions = [a for a in options["attentions"].split(",") if a]
    unknown = [a for a in attentions if a not in ATTENTION_NAMES]
    if unknown or not attentions:
        raise ConfigError(f"attentions={options['attentions']!r}: choose from {', '.join(ATTENTION_NAMES)}")
    if not options["steps"].isdigit() or int(options["steps"]) < 1:
        raise ConfigError(f"steps={options['steps']!r}: a whole number >= 1")
    if options["compile"] not in COMPILE_MODES:
        raise ConfigError(f"compile={options['compile']!r}: allowed {', '.join(COMPILE_MODES)}")
    if options["batch"] and options["save_batch"]:
        raise ConfigError("batch= and save_batch=: give one (save_batch= writes the file that batch= reads)")
    if options["save_batch"]:
        unused = [f"{key}=" for key, _ in overrides if key in ("steps", "commit", "attentions")]
        if unused or profile:
            raise ConfigError(f"save_batch= times nothing: leave out {(unused or ['--profile'])[0]}")
    if not torch.cuda.is_available() and not allow_cpu and not options["save_batch"]:
        raise ConfigError("bench_e2e needs a CUDA GPU (timings on a CPU mean nothing)")
    if options["compile"] != "off":  # the batches a compiled run trains on (lavo_tasks.data: fixed lengths)
        extra.append(f"trainer.compile={options['compile']}")
    if not any(key == "run.dir" for key, _ in overrides):  # where the default data and caches go, once
        extra.append(f"run.dir={Path(options['out']) / 'runs' / task}")
    settings = batch_settings(extra)
    if options["save_batch"]:  # (the data does not depend on the attention)
        save_batch(bench_config(task, attentions[0], extra)[0], settings, Path(options["save_batch"]))
        print(f"wrote {options['save_batch']}")
        return []
    saved = load_batch(Path(options["batch"]), task, settings) if options["batch"] else None
    configs = {a: bench_config(task, a, extra) for a in attentions}  # every config checked before any work
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    out = Path(options["out"])
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "task": task, "device": torch.cuda.get_device_name()
            if device.type == "cuda" else "cpu", "torch": torch.__version__, "overrides": extra,
            "compile": options["compile"], "commit": options["commit"] or checkout_commit()}
    if saved is not None:
        meta |= {"batch_file": options["batch"], "batch_settings": settings}
    rows = []
    with (out / f"bench_e2e_{task}.jsonl").open("w") as log:
        for name, (cfg, cross_fallback) in configs.items():
            profile_path = out / f"profile_{task}_{name}.txt" if profile else None
            rows.append(record({"attention": name, "cross_fallback": cross_fallback}, log, meta,
                               lambda: training_throughput(cfg, int(options["steps"]), device, options["compile"],
                                                           profile_path, saved)))
            if options["compile"] != "off":
                # Each attention compiles from a clean slate, as in a process of its own: the
                # graphs and CUDA graph pools of the attentions before it stay out of its step.
                torch._dynamo.reset()
    print(markdown_table(task, rows))
    return rows


def usage(argv=None) -> str:
    return __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> int:
    return run_cli(bench, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
