"""The end-to-end benchmark's harness on the CPU (its timings mean something only on a GPU)."""

import inspect
import json
import re
import types
import warnings

import pytest
import torch
import torch._dynamo

from lavo_tasks import bench_e2e
from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.errors import ConfigError

TSF_SMALL = ["model.d_model=128", "model.n_heads=2", "model.d_ff=64", "model.encoder_layers=1",
             "model.decoder_layers=1", "data.seq_len=32", "data.label_len=16", "data.pred_len=8", "data.batch_size=2"]


def test_every_attention_gets_a_row_with_the_counted_tokens(tmp_path):
    """tsf at tiny sizes, one step each: a row per attention with the protocol's keys; the
    stacks read seq_len (encoder) + label_len + pred_len (decoder) positions per sample."""
    out = tmp_path / "out"
    rows = bench_e2e.bench(["task=tsf", "steps=1", f"out={out}", *TSF_SMALL], allow_cpu=True)
    assert [r["attention"] for r in rows] == list(ATTENTION_NAMES)
    for r in rows:
        assert {"batch", "samples_per_s", "tokens_per_s", "tokens_per_step", "step_ms", "params", "loss"} <= r.keys()
        assert r["batch"] == 2 and r["tokens_per_step"] == 2 * (32 + 16 + 8)
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 56, rel=1e-6)
    assert [r["cross_fallback"] for r in rows] == [a == "local" for a in ATTENTION_NAMES]
    logged = [json.loads(line) for line in (out / "bench_e2e_tsf.jsonl").read_text().splitlines()]
    assert [r["attention"] for r in logged] == list(ATTENTION_NAMES) and logged[0]["task"] == "tsf"
    assert logged[0]["compile"] == "off" and logged[0]["commit"] == bench_e2e.checkout_commit() != ""


def test_the_commit_given_is_recorded_and_outside_a_checkout_it_is_unknown(tmp_path, monkeypatch):
    out = tmp_path / "out"
    bench_e2e.bench(["task=tsf", "attentions=softmax", "steps=1", "commit=abc1234", f"out={out}", *TSF_SMALL],
                    allow_cpu=True)
    assert json.loads((out / "bench_e2e_tsf.jsonl").read_text())["commit"] == "abc1234"
    monkeypatch.setattr(bench_e2e, "__file__", str(tmp_path / "bench_e2e.py"))  # tmp_path is no git checkout
    assert bench_e2e.checkout_commit() == "unknown"


def test_the_preset_is_cab_and_the_kernel_sizes_apply():
    cfg, fallback = bench_e2e.bench_config("lm", "lavo")
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == (768, 12, 12)
    assert (cfg.model.attention.window, cfg.model.attention.rank) == (128, 64) and not fallback


@pytest.mark.parametrize("args, message", [(["steps=1"], "name the task"),
                                           (["task=lm", "attentions=flash"], "choose from"),
                                           (["task=lm", "steps=0"], "steps='0'"),
                                           (["task=lm", "compile=fast"], "compile='fast': allowed off, default")])
def test_bad_arguments_are_one_line(args, message):
    with pytest.raises(ConfigError, match=message):
        bench_e2e.bench(args, allow_cpu=True)


def test_a_compiled_model_compiles_once_over_the_timed_steps(tmp_path, monkeypatch):
    """Counting tokens with hooks inside the compiled model made Dynamo compile it again at
    every step (it guarded on the running count); the count now comes from one eager
    forward, and the steps of the one batch reuse one graph (aot_eager: Dynamo's frames
    without Inductor's CPU compile)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(bench_e2e, "compile_model", lambda model, mode: model.compile(backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    rows = bench_e2e.bench(["task=tsf", "attentions=softmax", "steps=4", "compile=default", f"out={tmp_path}",
                            *TSF_SMALL], allow_cpu=True)
    assert rows[0]["tokens_per_step"] == 2 * (32 + 16 + 8)
    assert counters["frames"]["ok"] == 1, dict(counters["frames"])
    # the run's config compiles too, so a task that pads pads to its fixed lengths
    assert "trainer.compile=default" in json.loads((tmp_path / "bench_e2e_tsf.jsonl").read_text())["overrides"]


def test_host_syncs_name_the_line_of_each_sync(monkeypatch):
    """host_syncs keeps the sync warnings of one step (set_sync_debug_mode("warn") raises
    them at the Python line that called the op) as file:line, and nothing else."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no GPU here: the device calls are no-ops
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    lines = []

    def step():
        warnings.warn("called a synchronizing CUDA operation")
        lines.append(inspect.currentframe().f_lineno - 1)
        warnings.warn("an unrelated warning")

    assert bench_e2e.host_syncs(step) == [f"{__file__}:{lines[0]}"]


def test_host_syncs_leave_out_the_first_switch_of_the_mode(monkeypatch):
    """The first switch into "warn" in a process reports a sync of its own (seen on an
    H100 with torch 2.11, around a step that did nothing): a step without syncs counts none."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    switches = []

    def set_mode(mode):
        if not switches:
            warnings.warn("called a synchronizing CUDA operation")
        switches.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    modes_seen = []
    assert bench_e2e.host_syncs(lambda: modes_seen.append(switches[-1])) == []
    assert modes_seen == ["warn"] and switches[-1] == "default"  # the step ran in warn mode, then back


@pytest.mark.parametrize("mode, resets", [("off", 0), ("default", 2)])
def test_each_compiled_attention_starts_from_a_clean_slate(tmp_path, monkeypatch, mode, resets):
    """Compiled, Dynamo's caches and the CUDA graph pools are reset after every attention,
    so an attention's step never shares them with the one measured before it; eager
    rows reset nothing."""
    calls = []
    monkeypatch.setattr(bench_e2e, "compile_model", lambda model, mode: model.compile(backend="aot_eager"))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append(len(calls)))
    rows = bench_e2e.bench(["task=tsf", "attentions=softmax,local", "steps=1", f"compile={mode}", f"out={tmp_path}",
                            *TSF_SMALL], allow_cpu=True)
    assert [r["attention"] for r in rows] == ["softmax", "local"]
    assert len(calls) == resets


def test_compiled_graphs_run_without_cuda_graphs_are_counted(tmp_path, monkeypatch):
    """With reduce-overhead, a row counts the graphs Inductor compiled but ran without
    CUDA graphs during the warm-up (Inductor's own counter; here a stand-in compile
    skips one)."""
    from torch._dynamo.utils import counters

    def compile_skipping_one(model, mode):  # compiles at the first call, as torch.compile does
        def first_call(module, args):
            counters["inductor"]["cudagraph_skips"] += 1
            handle.remove()

        handle = model.register_forward_pre_hook(first_call)
        model.compile(backend="aot_eager")

    monkeypatch.setattr(bench_e2e, "compile_model", compile_skipping_one)
    # reduce-overhead needs a GPU to validate; the step itself is what is measured here
    cfg, _ = bench_e2e.bench_config("tsf", "softmax", [f"run.dir={tmp_path}", "trainer.compile=default", *TSF_SMALL])
    cpu = torch.device("cpu")
    assert bench_e2e.training_throughput(cfg, 1, cpu, "reduce-overhead")["cudagraph_skips"] == 1
    assert "cudagraph_skips" not in bench_e2e.training_throughput(cfg, 1, cpu, "default")


def test_a_row_keeps_the_fastest_timed_window(tmp_path, monkeypatch):
    """Three windows of `steps` steps timed 3 s, 1 s and 2 s (a stand-in clock): the row's
    step time is the fastest window's over its steps."""
    ticks = iter([1.0, 4.0, 10.0, 11.0, 20.0, 22.0])
    monkeypatch.setattr(bench_e2e, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    cfg, _ = bench_e2e.bench_config("tsf", "softmax", [f"run.dir={tmp_path}", *TSF_SMALL])
    row = bench_e2e.training_throughput(cfg, 4, torch.device("cpu"))
    assert bench_e2e.TIMED_WINDOWS == row["timed_windows"] == 3
    assert row["step_ms"] == pytest.approx(1000 / 4)
    assert row["samples_per_s"] == pytest.approx(4 * row["batch"] / 1.0)


def test_a_saved_batch_replaces_the_data_module(tmp_path, monkeypatch):
    """save_batch= writes the spec and first training batch where the data can be read (no
    GPU needed); batch= then measures the step without the task's DataModule (as on a GPU
    machine without open3d), and each row says which file and settings it measured."""
    file = tmp_path / "tsf_batch.pt"
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        assert bench_e2e.bench(["task=tsf", f"save_batch={file}", f"out={tmp_path / 'a'}", *TSF_SMALL]) == []
    saved = torch.load(file, weights_only=True)
    cfg, _ = bench_e2e.bench_config("tsf", "softmax", [*TSF_SMALL, f"run.dir={tmp_path / 'a' / 'runs' / 'tsf'}"])
    first = bench_e2e.spec_and_first_batch(cfg)
    assert saved["task"] == "tsf" and saved["spec"] == first["spec"] and saved["settings"] == sorted(TSF_SMALL[5:])
    assert saved["batch"].keys() == first["batch"].keys()
    assert all(torch.equal(saved["batch"][k], first["batch"][k]) for k in first["batch"])

    def no_data(cfg):
        raise AssertionError("the DataModule was built")

    monkeypatch.setattr(bench_e2e, "spec_and_first_batch", no_data)
    out = tmp_path / "b"
    rows = bench_e2e.bench(["task=tsf", "attentions=softmax,lavo", "steps=1", f"batch={file}", f"out={out}",
                            *TSF_SMALL], allow_cpu=True)
    assert [r["tokens_per_step"] for r in rows] == [2 * (32 + 16 + 8)] * 2
    logged = json.loads((out / "bench_e2e_tsf.jsonl").read_text().splitlines()[0])
    assert logged["batch_file"] == str(file) and logged["batch_settings"] == saved["settings"]


def test_a_batch_written_for_one_compiled_mode_serves_them_all(tmp_path):
    """Every compiled mode pads the batches alike, so a batch written with compile=default
    (which a machine without a GPU runs) serves reduce-overhead, and eager runs refuse it."""
    file = tmp_path / "compiled.pt"
    bench_e2e.bench(["task=tsf", f"save_batch={file}", "compile=default", f"out={tmp_path}", *TSF_SMALL])
    compiled = bench_e2e.batch_settings([*TSF_SMALL, "trainer.compile=reduce-overhead", "run.dir=x"])
    assert compiled == sorted([*(o for o in TSF_SMALL if o.startswith("data.")), "trainer.compile!=off"])
    assert bench_e2e.load_batch(file, "tsf", compiled)["settings"] == compiled
    for eager in ([], ["trainer.compile=off"]):
        with pytest.raises(ConfigError, match="not data.batch_size=2 data.label_len=16 data.pred_len=8 data.seq_len=32$"):
            bench_e2e.load_batch(file, "tsf", bench_e2e.batch_settings([*TSF_SMALL, *eager]))


def test_bad_batch_files_and_options_are_one_line(tmp_path):
    good = tmp_path / "good.pt"
    bench_e2e.bench(["task=tsf", f"save_batch={good}", f"out={tmp_path}", *TSF_SMALL])
    other = tmp_path / "other.pt"
    torch.save({"task": "pcc", "spec": {}, "batch": {}, "settings": []}, other)
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(2), tensor)
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint")
    cases = [
        ([f"batch={tmp_path / 'missing.pt'}", "steps=1"], f"batch={tmp_path / 'missing.pt'}: no such file"),
        ([f"batch={other}", "steps=1"], f"batch={other}: written for task=pcc, not task=tsf"),
        ([f"batch={tensor}", "steps=1"], f"batch={tensor}: not a file that save_batch= wrote"),
        ([f"batch={text}", "steps=1"], f"batch={text}: not a file that save_batch= wrote"),
        ([f"batch={good}", "data.batch_size=4", "steps=1"],
         f"batch={good}: written with data.batch_size=2 data.label_len=16"),
        ([f"batch={good}", "compile=default", "steps=1"],
         f"batch={good}: written with .* not .*trainer.compile!=off"),
        ([f"batch={good}", f"save_batch={good}"], "batch= and save_batch=: give one"),
        ([f"save_batch={good}", "steps=3"], "save_batch= times nothing: leave out steps="),
        ([f"save_batch={good}", "--profile"], "save_batch= times nothing: leave out --profile"),
        ([f"save_batch={text}/inside.pt"], f"save_batch={text}/inside.pt: "),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError) as error:
            bench_e2e.bench(["task=tsf", f"out={tmp_path}", *TSF_SMALL, *args], allow_cpu=True)
        assert re.match(message if ".*" in message else re.escape(message), str(error.value)), str(error.value)
        assert "\n" not in str(error.value)
