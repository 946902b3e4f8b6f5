"""The train / evaluate commands end to end: run folder contents, exact resume, evaluate.

The runner is exercised on a tiny task defined here (a next-token model with dropout on
a fixed random token table), so the resume and evaluate checks cost seconds.
"""

import json
import types

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader

import lavo_tasks.config
import lavo_tasks.runner
import lavo_tasks.tasks
from lavo_tasks import evaluate, train
from lavo_tasks.data import StepBatchSampler
from lavo_tasks.module import TaskModule

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


class TinyData(L.LightningDataModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(1234)
        # [n_items, 2]: an input token and the token to predict (a fixed function + noise).
        inputs = torch.randint(cfg.data.vocab, (cfg.data.n_items,), generator=g)
        targets = (3 * inputs + torch.randint(2, (cfg.data.n_items,), generator=g)) % cfg.data.vocab
        self.table = torch.stack([inputs, targets], dim=1)

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
    def __init__(self, cfg, datamodule):
        super().__init__(cfg)
        vocab, width = cfg.data.vocab, cfg.model.d_model
        self.net = nn.Sequential(nn.Embedding(vocab, width), nn.Dropout(cfg.model.dropout), nn.Linear(width, vocab))

    def loss(self, batch):
        logits = self.net(batch[:, 0])
        return nn.functional.cross_entropy(logits, batch[:, 1]), logits

    def training_step(self, batch, batch_idx):
        return self.loss(batch)[0]

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
        raise lavo_tasks.config.ConfigError(f"data.vocab={cfg.data.vocab}: must be >= 2")


@pytest.fixture
def tiny_task(monkeypatch):
    module = types.SimpleNamespace(DataModule=TinyData, Module=TinyModule, check_config=check_tiny_config)
    real_names, real_load, real_yaml = (lavo_tasks.tasks.task_names, lavo_tasks.tasks.load_task,
                                        lavo_tasks.config.task_yaml)
    monkeypatch.setattr(lavo_tasks.tasks, "task_names", lambda: sorted([*real_names(), "tiny"]))
    monkeypatch.setattr(lavo_tasks.tasks, "load_task", lambda name: module if name == "tiny" else real_load(name))
    monkeypatch.setattr(lavo_tasks.config, "task_yaml",
                        lambda name: OmegaConf.create(TINY_YAML) if name == "tiny" else real_yaml(name))
    TRAIN_LOADER_STARTS.clear()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_writes_the_run_folder(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    metrics = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=7"])

    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.task == "tiny" and saved.run.dir == str(run_dir) and saved.trainer.max_steps == 7
    assert saved.attention.name == "softmax" and saved.run.resume == ""
    # Validation at steps 3 and 6; training ends at 7, between two validations.
    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert [line["step"] for line in lines] == [3, 6]
    assert all(set(line) == {"step", "val_loss"} and line["val_loss"] > 0 for line in lines)
    # last.ckpt holds the final weights (step 7), best.ckpt the best validation.
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 7
    assert (run_dir / "checkpoints" / "best.ckpt").is_file()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert json.loads((run_dir / "metrics.json").read_text()) == metrics
    assert set(metrics) == {"test_loss", "test_acc"} and 0 <= metrics["test_acc"] <= 1
    assert (run_dir / "artifacts" / "weights.txt").is_file()


class StopAt(L.Callback):
    """Ends the process's training abruptly (as Ctrl-C or a crash would) at a step."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


def test_resume_equals_an_uninterrupted_run(tiny_task, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    expected = train.run(["task=tiny", f"run.dir={straight}", "trainer.max_steps=12"])

    # The same run crashes at step 7: its last checkpoint is from the validation at step 6.
    interrupted = tmp_path / "interrupted"
    build = lavo_tasks.runner.build_trainer

    def crashing_trainer(cfg, run_dir, *, fitting):
        trainer = build(cfg, run_dir, fitting=fitting)
        trainer.callbacks.insert(0, StopAt(7))
        return trainer

    monkeypatch.setattr(lavo_tasks.runner, "build_trainer", crashing_trainer)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.run(["task=tiny", f"run.dir={interrupted}", "trainer.max_steps=12"])
    monkeypatch.setattr(lavo_tasks.runner, "build_trainer", build)
    assert not (interrupted / "metrics.json").exists()
    assert torch.load(interrupted / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6

    resumed = train.run([f"run.dir={interrupted}", "run.resume=last"])
    # The training batches restarted at the checkpoint's step, not at 0.
    assert TRAIN_LOADER_STARTS == [0, 0, 6]
    assert resumed == expected
    assert read_jsonl(interrupted / "metrics.jsonl") == read_jsonl(straight / "metrics.jsonl")
    assert (interrupted / "artifacts" / "weights.txt").read_text() == (straight / "artifacts" / "weights.txt").read_text()


def test_resume_can_raise_max_steps(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=4"])
    train.run([f"run.dir={run_dir}", "run.resume=last", "trainer.max_steps=7"])
    assert OmegaConf.load(run_dir / "config.yaml").trainer.max_steps == 7
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 7
    assert TRAIN_LOADER_STARTS == [0, 4]
    assert [line["step"] for line in read_jsonl(run_dir / "metrics.jsonl")] == [3, 6]


def test_evaluate_reproduces_the_test_metrics(tiny_task, tmp_path):
    run_dir = tmp_path / "run"
    trained = train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=5"])
    weights = (run_dir / "artifacts" / "weights.txt").read_text()
    (run_dir / "metrics.json").unlink()
    (run_dir / "artifacts" / "weights.txt").unlink()

    assert evaluate.main([f"run.dir={run_dir}"]) == 0
    assert json.loads((run_dir / "metrics.json").read_text()) == trained
    assert (run_dir / "artifacts" / "weights.txt").read_text() == weights
    # The best checkpoint (validation at step 3) is another set of weights.
    best = evaluate.run([f"run.dir={run_dir}", "ckpt=best"])
    assert set(best) == set(trained) and best != trained


def test_a_fresh_run_does_not_overwrite_an_old_one(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
    assert train.main(["task=tiny", f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run.dir=") and "run.resume=last" in err and err.count("\n") == 1


def test_resume_errors(tiny_task, tmp_path, capsys):
    cases = [
        ([f"run.dir={tmp_path / 'none'}", "run.resume=last"], "no config.yaml there"),
        (["run.resume=last"], "needs run.dir"),
    ]
    run_dir = tmp_path / "run"
    train.run(["task=tiny", f"run.dir={run_dir}", "trainer.max_steps=1"])
    cases += [
        ([f"run.dir={run_dir}", "run.resume=last", "model.d_model=32"], "only trainer.* and run.* keys"),
        ([f"run.dir={run_dir}", "run.resume=last", "task=lm"], "keeps its task"),
        ([f"run.dir={run_dir}", f"run.resume={tmp_path / 'x.ckpt'}"], "expected last or the path of a checkpoint"),
    ]
    for args, message in cases:
        assert train.main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (args, err)


def test_trainer_keys_are_checked_by_lightning_before_any_work(tiny_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main(["task=tiny", f"run.dir={run_dir}", "trainer.precision=17-mixed"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: trainer: ") and "17-mixed" in err and err.count("\n") == 1
    assert not run_dir.exists()


def test_evaluate_errors(tmp_path, capsys):
    cases = [
        ([], "run.dir: missing"),
        ([f"run.dir={tmp_path}"], "no config.yaml there"),
        ([f"run.dir={tmp_path}", "ckpt=last", "seed=3"], "unknown argument 'seed'"),
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
