"""The train / evaluate commands end to end: run folder contents, exact resume, evaluate.

The runner is exercised on a tiny task defined here (a next-token model with dropout on
a fixed random token table), so the resume and evaluate checks cost seconds.
"""

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader

import lavo_tasks.config
import lavo_tasks.run.callbacks
import lavo_tasks.run.checkpoints
import lavo_tasks.run.commands
import lavo_tasks.run.trainer
import lavo_tasks.tasks
from lavo_tasks import evaluate, train
from lavo_tasks.data import StepBatchSampler
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.module import TaskModule
from lavo_tasks.run import RunDir
from lavo_tasks.task import Task

TINY_YAML = """
data:
  n_items: 96
  vocab: 11
  batch_size: 8
model:
  d_model: 16
  n_heads: 2
  dropout: 0.2
trainer:
  max_steps: 8
  val_check_interval: 3
  limit_val_batches: 2
  enable_progress_bar: false
"""

# The global step each training dataloader was built at, in order (one entry per fit).
TRAIN_LOADER_STARTS: list[int] = []
SPEC_CALLS: list[int] = []  # one entry per TinyData.spec() call


def read_pairs(path):
    """The tiny task's file format: one `input target` pair of token ids a line."""
    pairs = []
    for number, line in enumerate(open(path).read().splitlines(), 1):
        fields = line.split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise DataError(f"{path}:{number}: expected two token ids, got {line!r}")
        pairs.append([int(field) for field in fields])
    return torch.tensor(pairs)


class TinyData(L.LightningDataModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        if cfg.data.path:
            self.table = read_pairs(cfg.data.path)
            return
        g = torch.Generator().manual_seed(1234)
        # [n_items, 2]: an input token and the token to predict (a fixed function + noise).
        inputs = torch.randint(cfg.data.vocab, (cfg.data.n_items,), generator=g)
        targets = (3 * inputs + torch.randint(2, (cfg.data.n_items,), generator=g)) % cfg.data.vocab
        self.table = torch.stack([inputs, targets], dim=1)

    def spec(self):
        SPEC_CALLS.append(1)
        return {"vocab_size": int(self.table.max()) + 1}

    def train_dataloader(self):
        start = self.trainer.global_step
        TRAIN_LOADER_STARTS.append(start)
        sampler = StepBatchSampler(len(self.table), self.cfg.data.batch_size, self.cfg.seed, start_step=start)
        return DataLoader(self.table, batch_sampler=sampler)

    def val_dataloader(self):
        return DataLoader(self.table[:32], batch_size=8)

    def test_dataloader(self):
        return DataLoader(self.table[32:], batch_size=16)


class TinyModule(TaskModule):
    def __init__(self, cfg, spec):
        super().__init__(cfg)
        vocab, width = spec["vocab_size"], cfg.model.d_model
        self.net = nn.Sequential(nn.Embedding(vocab, width), nn.Dropout(cfg.model.dropout), nn.Linear(width, vocab))

    def loss(self, batch):
        logits = self.net(batch[:, 0])
        return nn.functional.cross_entropy(logits, batch[:, 1]), logits

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)[0]
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch)[0])

    def test_step(self, batch, batch_idx):
        loss, logits = self.loss(batch)
        self.log("test_loss", loss)
        self.log("test_acc", (logits.argmax(-1) == batch[:, 1]).float().mean())

    def on_test_epoch_end(self):
        weights = self.net[2].weight.detach()
        (self.artifacts_dir / "weights.txt").write_text(f"{weights.sum().item():.8f}\n")


def check_tiny_config(cfg):
    if cfg.data.vocab < 2:
        raise ConfigError(f"data.vocab={cfg.data.vocab}: must be >= 2")


@pytest.fixture
def tiny_task(register_task):
    task = Task(name="tiny", DataModule=TinyData, Module=TinyModule, check_config=check_tiny_config,
                sites={"attention": "CS"})
    register_task(task, TINY_YAML)
    TRAIN_LOADER_STARTS.clear()
    SPEC_CALLS.clear()


def tiny_driver(patch: str) -> str:
    """The text of a script that registers the tiny task, runs `patch` (Python source
    that may change `tiny.TinyModule`), then `train.main(sys.argv[1:])`: for tests that
    need the tiny task in a process of its own."""
    return f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import lavo_tasks.tasks
from lavo_tasks.task import Task
import test_train_cli as tiny
task = Task(name="tiny", DataModule=tiny.TinyData, Module=tiny.TinyModule, check_config=tiny.check_tiny_config,
            sites={{"attention": "CS"}})
names, load, task_yaml = lavo_tasks.tasks.task_names, lavo_tasks.tasks.load_task, lavo_tasks.tasks.task_yaml_text
lavo_tasks.tasks.task_names = lambda: sorted([*names(), "tiny"])
lavo_tasks.tasks.load_task = lambda n: task if n == "tiny" else load(n)
lavo_tasks.tasks.task_yaml_text = lambda n: tiny.TINY_YAML if n == "tiny" else task_yaml(n)
{patch}
from lavo_tasks import train
sys.exit(train.main(sys.argv[1:]))
"""


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_writes_the_run_folder(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=7", "trainer.log_every_n_steps=2"])

    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.task == "tiny" and saved.run.dir == str(run_dir) and saved.trainer.max_steps == 7
    assert OmegaConf.to_container(saved.model.attention) == {"name": "softmax", "alibi": False} and saved.run.resume == ""
    assert json.loads((run_dir / "spec.json").read_text()) == {"vocab_size": 11}
    # Validation at steps 3 and 6, and at 7, where training ends between two intervals.
    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert [line["step"] for line in lines] == [3, 6, 7]
    assert all(set(line) == {"step", "val_loss"} and line["val_loss"] > 0 for line in lines)
    # last.ckpt holds the final weights (step 7), best.ckpt the best validation.
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 7
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=False)
    assert best["global_step"] == min(lines, key=lambda line: line["val_loss"])["step"]
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert json.loads((run_dir / "metrics.json").read_text()) == metrics
    assert set(metrics) == {"test_loss", "test_acc"} and 0 <= metrics["test_acc"] <= 1
    assert (run_dir / "artifacts" / "weights.txt").is_file()
    # One training log: a row every 2 steps, and one per validation.
    with open(run_dir / "logs" / "metrics.csv") as f:
        log = list(csv.DictReader(f))
    assert [int(row["step"]) for row in log if row["train_loss"]] == [2, 4, 6]
    assert [(int(row["step"]), float(row["val_loss"])) for row in log if row["val_loss"]] == [
        (line["step"], line["val_loss"]) for line in lines]
    assert all(float(row["samples_per_s"]) > 0 and float(row["lr"]) > 0 for row in log if row["train_loss"])
    assert (run_dir / "artifacts" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_run_dir_is_runs_task_timestamp(tiny_task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train.run(["task=tiny", "trainer.max_steps=1"])
    (run_dir,) = (tmp_path / "runs" / "tiny").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}", run_dir.name)
    assert OmegaConf.load(run_dir / "config.yaml").run.dir == f"runs/tiny/{run_dir.name}"
    assert (run_dir / "metrics.json").is_file()


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("simulated failure while writing")


def test_checkpoints_are_written_atomically(tiny_task, tmp_path):
    cfg = lavo_tasks.config.compose(["task=tiny"])
    assert isinstance(lavo_tasks.run.trainer.build_trainer(cfg, RunDir(tmp_path), fitting=True).strategy.checkpoint_io,
                      lavo_tasks.run.checkpoints.AtomicCheckpointIO)
    io, path = lavo_tasks.run.checkpoints.AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "weights": torch.arange(4.0)}, path)
    big = torch.zeros(1 << 20)  # written before the failing object: the file is part-written when it fails
    with pytest.raises(RuntimeError, match="simulated failure"):
        io.save_checkpoint({"step": 2, "weights": big, "later": Unpicklable()}, path)
    assert torch.load(path)["step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


class CrashAt(L.Callback):
    """Ends training abruptly (as Ctrl-C or a crash would) when it reaches a step."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


def train_until_crash(monkeypatch, args, step):
    """`train.run(args)` with a crash at `step`."""
    build = lavo_tasks.run.commands.build_trainer

    def crashing_trainer(cfg, run_dir, *, fitting):
        trainer = build(cfg, run_dir, fitting=fitting)
        trainer.callbacks.insert(0, CrashAt(step))
        return trainer

    with monkeypatch.context() as patch:
        patch.setattr(lavo_tasks.run.commands, "build_trainer", crashing_trainer)
        with pytest.raises(RuntimeError, match="simulated crash"):
            train.run(args)


def test_resume_equals_an_uninterrupted_run(tiny_task, tmp_path, monkeypatch):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    expected = train.run(["task=tiny", f"run.dir={straight}", "trainer.max_steps=12"])

    # The same run crashes at step 7: its last checkpoint is from the validation at step 6.
    train_until_crash(monkeypatch, ["task=tiny", f"run.dir={interrupted}", "trainer.max_steps=12"], step=7)
    assert not (interrupted / "metrics.json").exists()
    assert torch.load(interrupted / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6

    resumed = train.run([f"run.dir={interrupted}", "run.resume=last", "task=tiny", "attention=softmax"])
    # The training batches restarted at the checkpoint's step, not at 0.
    assert TRAIN_LOADER_STARTS == [0, 0, 6]
    assert resumed == expected
    assert read_jsonl(interrupted / "metrics.jsonl") == read_jsonl(straight / "metrics.jsonl")
    assert (interrupted / "artifacts" / "weights.txt").read_text() == (straight / "artifacts" / "weights.txt").read_text()
    # One log across the restart, with the rows of the straight run (timings aside).
    def log_rows(run):
        with open(run / "logs" / "metrics.csv") as f:
            return [(row["step"], row["train_loss"], row["lr"], row["val_loss"]) for row in csv.DictReader(f)]
    assert {p.name for p in (interrupted / "logs").iterdir()} == {"metrics.csv"}
    assert log_rows(interrupted) == log_rows(straight)


def test_a_resumed_run_drops_the_validations_after_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": step, "val_loss": 1.0 / step}) + "\n" for step in (3, 6, 9)))
    lavo_tasks.run.callbacks.ValidationLog(path).on_train_start(types.SimpleNamespace(global_step=6), None)
    assert read_jsonl(path) == [{"step": 3, "val_loss": 1 / 3}, {"step": 6, "val_loss": 1 / 6}]


def test_resume_can_raise_max_steps(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=4"])
    train.run([f"run.dir={run_dir}", "run.resume=last", "trainer.max_steps=7"])
    assert OmegaConf.load(run_dir / "config.yaml").trainer.max_steps == 7
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 7
    assert TRAIN_LOADER_STARTS == [0, 4]
    # 3 and the end (4) of the first run; 6 and the end (7) of the extension.
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [3, 4, 6, 7]


def only_eval_dir(run_dir):
    """The one folder under eval/: the result of the run's only evaluate so far."""
    (folder,) = (run_dir / "eval").iterdir()
    return folder


def test_evaluate_reproduces_the_test_metrics(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    trained = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=5"])
    weights = (run_dir / "artifacts" / "weights.txt").read_text()
    run_files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}

    assert SPEC_CALLS == [1]
    assert evaluate.main([f"run.dir={run_dir}"]) == 0
    assert SPEC_CALLS == [1]  # the model came from the saved spec.json, not from the data
    folder = only_eval_dir(run_dir)
    assert re.fullmatch(r"last-\d{8}-\d{6}", folder.name)
    assert json.loads((folder / "metrics.json").read_text()) == trained
    assert (folder / "artifacts" / "weights.txt").read_text() == weights
    assert json.loads((folder / "metrics.meta.json").read_text())["checkpoint"]["step"] == 5
    # The training run's own files are untouched.
    assert {p: p.read_bytes() for p in run_files} == run_files
    # The best checkpoint: from the validation at step 3 or the one at the end (5).
    best = evaluate.run([f"run.dir={run_dir}", "ckpt=best"])
    best_step = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=False)["global_step"]
    (best_folder,) = (run_dir / "eval").glob("best-*")
    assert json.loads((best_folder / "metrics.meta.json").read_text())["checkpoint"] == {
        "name": "best", "path": str(run_dir / "checkpoints" / "best.ckpt"), "step": best_step}
    assert set(best) == set(trained) and (best == trained) == (best_step == 5)
    assert evaluate.run([f"run.dir={run_dir}", f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}"]) == trained
    assert len(list((run_dir / "eval").iterdir())) == 3
    with pytest.raises(ConfigError, match=r"ckpt='first': no checkpoint at .*first"):
        evaluate.run([f"run.dir={run_dir}", "ckpt=first"])


def test_a_fresh_run_does_not_overwrite_an_old_one(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
    capsys.readouterr()
    assert train.main(["task=tiny", f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run.dir=") and "run.resume=last" in err and err.count("\n") == 1


def test_resume_errors(tiny_task, tmp_path, capsys):
    cases = [
        ([f"run.dir={tmp_path / 'none'}", "run.resume=last"], "no config.yaml there"),
        (["run.resume=last"], "resume needs run.dir"),
    ]
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
    capsys.readouterr()
    cases += [
        ([f"run.dir={run_dir}", "run.resume=last", "model.d_model=32"], "only trainer.* and run.* keys"),
        ([f"run.dir={run_dir}", "run.resume=last", "task=lm"], "task='lm': a resumed run keeps its task (tiny)"),
        ([f"run.dir={run_dir}", "run.resume=last", "attention=gsa"], "a resumed run keeps its attention (softmax)"),
        ([f"run.dir={run_dir}", f"run.resume={tmp_path / 'x.ckpt'}"], "expected last or the path of a checkpoint"),
    ]
    for args, message in cases:
        assert train.main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (args, err)


def test_a_bad_data_file_is_one_line_and_the_command_can_be_repeated(tiny_task, tmp_path, capsys):
    data, run_dir = tmp_path / "pairs.txt", tmp_path / "run"
    data.write_text("1 3\n2 five\n")
    args = ["task=tiny", f"data.path={data}", f"run.dir={run_dir}", "trainer.max_steps=1",
            "trainer.limit_val_batches=1", "trainer.val_check_interval=1"]
    assert train.main(args) == 2
    assert capsys.readouterr().err == f"error: {data}:2: expected two token ids, got '2 five'\n"
    data.write_text("".join(f"{i % 11} {(3 * i) % 11}\n" for i in range(40)))
    assert train.main(args) == 0
    assert OmegaConf.load(run_dir / "config.yaml").data.path == str(data)


def test_trainer_from_the_config(tiny_task, tmp_path):
    cfg = lavo_tasks.config.compose(["task=tiny", "trainer.max_steps=9", "optim.grad_clip=0.5",
                                     "trainer.limit_val_batches=3"])
    trainer = lavo_tasks.run.trainer.build_trainer(cfg, RunDir(tmp_path), fitting=True)
    assert trainer.max_steps == 9 and trainer.limit_val_batches == 3 and trainer.val_check_interval == 3
    assert trainer.precision == "32-true"  # precision: auto, no GPU here
    assert trainer.gradient_clip_val == 0.5
    cfg = lavo_tasks.config.compose(["task=tiny", "optim.grad_clip=0", "trainer.precision=bf16-mixed"])
    trainer = lavo_tasks.run.trainer.build_trainer(cfg, RunDir(tmp_path), fitting=True)
    assert trainer.gradient_clip_val is None and trainer.precision == "bf16-mixed"


def test_trainer_keys_are_checked_by_lightning_before_any_work(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main(["task=tiny", f"run.dir={run_dir}", "trainer.accelerator=abacus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: trainer: ") and "abacus" in err and err.count("\n") == 1
    assert not run_dir.exists()


def test_evaluate_errors(tmp_path, capsys):
    cases = [
        ([], "run.dir: missing"),
        ([f"run.dir={tmp_path}"], "no config.yaml there"),
        ([f"run.dir={tmp_path}", "ckpt=last", "seed=3"], "seed: evaluate keeps the run's model and training keys"),
    ]
    for args, message in cases:
        assert evaluate.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (args, err)


def test_step_batches_shard_across_processes():
    def drawn(step, count):  # what the step's generator draws, by its definition
        return torch.randint(50, (count,), generator=torch.Generator().manual_seed(7 * 1_000_003 + step)).tolist()

    alone = StepBatchSampler(50, 3, seed=7, start_step=4)
    assert [next(iter(alone)) for _ in range(2)] == [drawn(4, 3)] * 2
    batches = iter(alone)
    assert [next(batches), next(batches)] == [drawn(4, 3), drawn(5, 3)]
    ranks = [iter(StepBatchSampler(50, 3, seed=7, start_step=4, rank=r, world_size=2)) for r in range(2)]
    for step in (4, 5):
        assert next(ranks[0]) + next(ranks[1]) == drawn(step, 6)


# The real LM task at toy sizes (the default data: the standard-library corpus).
LM_TINY = ["task=lm", "data.seq_len=16", "data.batch_size=4", "model.d_model=32", "model.n_layers=1",
           "model.n_heads=2", "model.d_ff=32", "generate.prompt_tokens=8", "generate.max_new_tokens=8",
           "trainer.limit_val_batches=1", "trainer.limit_test_batches=2", "trainer.val_check_interval=2"]


@pytest.mark.slow
def test_lm_cli_end_to_end_and_evaluate(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.train", *LM_TINY, "trainer.max_steps=4",
                             f"run.dir={run_dir}"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Steps" in result.stderr + result.stdout  # the progress bar (lavo_tasks.quiet.StepProgressBar)

    cfg = OmegaConf.load(run_dir / "config.yaml")
    assert cfg.task == "lm" and cfg.trainer.max_steps == 4 and cfg.model.d_model == 32
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {"last.ckpt", "best.ckpt"}
    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert [line["step"] for line in lines] == [2, 4] and all(line["val_loss"] > 0 for line in lines)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert {"test_ppl", "test_ppl_2x", "test_ppl_4x", "test_ppl_8x"} <= set(metrics)
    assert all(1 < value < float("inf") for value in metrics.values())
    artifacts = {p.name: p.read_bytes() for p in (run_dir / "artifacts").iterdir()}
    assert artifacts and all(artifacts.values())

    # evaluate rebuilds the run from config.yaml + last.ckpt and reproduces both.
    assert evaluate.main([f"run.dir={run_dir}", "ckpt=last"]) == 0
    folder = only_eval_dir(run_dir)
    assert json.loads((folder / "metrics.json").read_text()) == metrics
    assert {p.name: p.read_bytes() for p in (folder / "artifacts").iterdir() if p.suffix == ".txt"} == {
        name: data for name, data in artifacts.items() if name.endswith(".txt")}


@pytest.mark.slow
def test_lm_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    args = [*LM_TINY, "model.dropout=0.1", "trainer.max_steps=6", "trainer.enable_progress_bar=false"]
    expected = train.run([*args, f"run.dir={straight}"])
    train_until_crash(monkeypatch, [*args, f"run.dir={interrupted}"], step=3)
    assert torch.load(interrupted / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2

    assert train.run([f"run.dir={interrupted}", "run.resume=last"]) == expected
    assert read_jsonl(interrupted / "metrics.jsonl") == read_jsonl(straight / "metrics.jsonl")
    generated = "artifacts/generated.txt"
    assert (interrupted / generated).read_text() == (straight / generated).read_text()


@pytest.mark.slow
def test_lm_ddp_on_two_processes_trains_like_one(tmp_path):
    """trainer.devices/strategy pass through to Lightning: 2 CPU processes x 2 sequences
    per step (DDP, gloo) end with the weights of 1 process x 4 sequences."""
    args = [*LM_TINY, "trainer.max_steps=3", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]
    train.run([*args, "data.batch_size=4", f"run.dir={tmp_path / 'one'}"])
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.train", *args, "data.batch_size=2",
                             "trainer.devices=2", "trainer.strategy=ddp", f"run.dir={tmp_path / 'two'}"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = (torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
                for name in ("one", "two"))
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6)
    assert json.loads((tmp_path / "two" / "metrics.json").read_text()).keys() == {
        "test_ppl", "test_ppl_2x", "test_ppl_4x", "test_ppl_8x"}


# --- a task added as the README's "Adding a task" says, from a folder on LAVO_TASKS_PATH

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_task_files() -> dict[str, str]:
    """The README's "Adding a task" example: {path: text} of its code blocks whose first
    line is `# <path>`."""
    section = README.read_text().split("\n## Adding a task\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:python|yaml)\n(.*?)```", section, flags=re.S)
    return {block.partition("\n")[0].removeprefix("# "): block for block in blocks}


def attention_yaml(name):
    path = lavo_tasks.config.resources.files("lavo_tasks.configs") / f"attention/{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(str(path)).attention)


def test_the_readme_task_trains_from_a_folder_and_its_run_outlives_the_yaml_defaults(tmp_path, monkeypatch):
    files = readme_task_files()
    assert set(files) == {"tasks/count/__init__.py", "configs/task/count.yaml"}  # one folder, one YAML file
    root = tmp_path / "my-tasks"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "lavo_tasks.train", "task=count", "attention=local", f"run.dir={run_dir}",
         "trainer.max_steps=30", "trainer.val_check_interval=10", "optim.warmup_steps=5", "optim.lr=0.01",
         "trainer.enable_progress_bar=false"],
        env={**os.environ, "LAVO_TASKS_PATH": str(root)}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert set(metrics) == {"test_loss", "test_uniform_loss"}
    assert metrics["test_uniform_loss"] == pytest.approx(math.log(16))
    assert metrics["test_loss"] < 0.5 * metrics["test_uniform_loss"]  # it learned to count
    assert json.loads((run_dir / "spec.json").read_text()) == {"vocab_size": 16}
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert OmegaConf.to_container(saved.model.attention) == attention_yaml("local")  # the site's whole config

    # The installed default of the site's attention changes after the run: a config
    # composed now has it, the saved run does not, and evaluate reproduces the run.
    monkeypatch.setenv("LAVO_TASKS_PATH", str(root))
    real_read = lavo_tasks.config.read_yaml

    def read_changed(path):
        cfg = real_read(path)
        if path == "attention/local.yaml":
            cfg.attention.window = 2
        return cfg

    monkeypatch.setattr(lavo_tasks.config, "read_yaml", read_changed)
    assert lavo_tasks.config.compose(["task=count", "attention=local"]).model.attention.window == 2
    assert evaluate.run([f"run.dir={run_dir}"]) == metrics
    # The same weights under the window composed now are another model, which evaluate
    # refuses: the saved site config is what made it exact.
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    saved.model.attention.window = 2
    (other / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    with pytest.raises(ConfigError, match=r"whose attention\.attention\.window is 32; .* has 2"):
        evaluate.run([f"run.dir={other}"])


def test_an_unknown_task_or_a_task_without_its_package_is_one_line(tmp_path, monkeypatch, capsys):
    root = tmp_path / "my-tasks"
    (root / "configs" / "task").mkdir(parents=True)
    (root / "configs" / "task" / "ghost.yaml").write_text("model:\n  attention: ''\n")
    monkeypatch.setenv("LAVO_TASKS_PATH", str(root))
    assert "ghost" in lavo_tasks.tasks.task_names()
    assert train.main(["task=ghost", f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: task='ghost': configs/task/ghost.yaml exists but no package lavo_tasks.tasks.ghost "
                   "(a folder tasks/ghost/ with an __init__.py)\n")
    (root / "tasks" / "ghost").mkdir(parents=True)
    (root / "tasks" / "ghost" / "__init__.py").write_text("TASK = None\n")
    assert train.main(["task=ghost", f"run.dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == ("error: task='ghost': lavo_tasks.tasks.ghost must export "
                                       "TASK = lavo_tasks.task.Task(name='ghost', ...)\n")


def test_a_non_finite_loss_stops_the_run_in_one_line(tiny_task, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    healthy = TinyModule.training_step

    def nan_from_step_5(self, batch, batch_idx):
        loss = healthy(self, batch, batch_idx)
        return loss * float("nan") if self.global_step >= 4 else loss

    monkeypatch.setattr(TinyModule, "training_step", nan_from_step_5)
    # run.checkpoint_every=1 writes last.ckpt after every step: it must never get the NaN update.
    assert train.main(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=8", "run.checkpoint_every=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stopped: the gradients are not finite at step 5 (train_loss nan on this process); ")
    assert err.endswith(f"; {run_dir / 'checkpoints' / 'best.ckpt'} holds the weights of the best validation "
                        f"before it\n") and err.count("\n") == 1, err
    assert not (run_dir / "metrics.json").exists()  # no test of NaN weights
    for name, step in (("best", 3), ("last", 4)):  # the validation at step 3; the step before the NaN
        checkpoint = torch.load(run_dir / "checkpoints" / f"{name}.ckpt", weights_only=False)
        assert checkpoint["global_step"] == step, name
        assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values()), name


def test_a_non_finite_loss_before_any_validation_names_no_best_ckpt(tiny_task, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(TinyModule, "training_step", lambda self, batch, i: self.loss(batch)[0] * float("inf"))
    assert train.main(["task=tiny", f"run.dir={tmp_path / 'run'}", "trainer.max_steps=8"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stopped: the gradients are not finite at step 1 (train_loss inf on this process); ")
    assert "best.ckpt" not in err, err
