"""Each task's test metrics are the same on one process and on two (DDP over gloo, CPU).

A tiny run trains on one process (its test writes metrics.json); `evaluate` then tests
the same last.ckpt on two processes. A task whose test loader shards the split
(lavo_tasks.data.ShardSampler) passes only if its metrics sum over the processes
(lavo_tasks.metrics); one that tests the whole split on every process passes as long as
nothing is counted once per process.

To cover a task, add a function to TINY_RUNS that returns the arguments of a tiny run
(writing any small data files it needs under the test's tmp_path) whose test reads at
least 2 batches (so each process has a share), without
trainer.limit_test_batches (it counts each process's batches, so 1 and 2 processes would
test different items).

The last test: a training loss that turns NaN on one process stops both at that step.
"""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from lavo_tasks import train
from lavo_tasks.data import ShardSampler

def lm_run(tmp_path):
    corpus = tmp_path / "corpus"  # small files: the embedded stdlib corpus takes each process a while to read
    corpus.mkdir()
    for name, text in [("train.txt", "the quick brown fox jumps over the lazy dog. "), ("valid.txt", "a lazy fox. "),
                       ("test.txt", "a quick fox and a lazy dog. ")]:
        (corpus / name).write_text(text * 40)
    return ["task=lm", f"data.path={corpus}", "data.seq_len=8", "data.batch_size=4", "model.d_model=16",
            "model.n_layers=1", "model.n_heads=2", "model.d_ff=32", "generate.prompt_tokens=4",
            "generate.max_new_tokens=4", "trainer.limit_val_batches=1", "trainer.val_check_interval=2"]


def tsf_run(tmp_path):
    # 400 hourly rows, fewer than an ETTh file: split 70/10/20 %, so the test reads rows
    # 304..399 (seq_len before its 80), 77 windows, 5 batches (the last one partial);
    # the default series has 14,400 rows to generate and 2,880 to test
    rows = 400
    series = tmp_path / "series.csv"
    hours = [f"2020-01-{1 + i // 24:02d} {i % 24:02d}:00:00" for i in range(rows)]
    # periods of 23 and 13 hours, not 24: the seasonal-naive error of MASE is not 0
    series.write_text("date,a,OT\n" + "".join(f"{d},{(i * 7) % 23}.0,{(i * i) % 13}.5\n" for i, d in enumerate(hours)))
    return ["task=tsf", f"data.path={series}", "model.d_model=16", "model.n_heads=2", "model.encoder_layers=1",
            "model.decoder_layers=1", "model.d_ff=32", "data.seq_len=16", "data.label_len=8", "data.pred_len=4", "data.batch_size=16",
            "trainer.limit_val_batches=1", "trainer.val_check_interval=2"]


def pcc_run(tmp_path):
    from pcn_layout import write_layout  # (open3d, imported only by this row)

    splits = {"train": ["m0", "m1"], "val": ["m2"], "test": ["m3", "m4", "m5", "m6", "m7"]}  # shares of 3 and 2
    root = write_layout(tmp_path / "pcn", {"01": ("blob", splits)}, views=dict.fromkeys(splits, 1), points=80)
    return ["task=pcc", f"data.path={root}", "data.n_input=32", "data.n_gt=64", "data.batch_size=2",
            "model.d_model=16", "model.n_heads=2", "model.n_proxies=8", "model.n_neighbors=4",
            "model.encoder_layers=1", "model.decoder_layers=1", "model.n_queries=4", "model.fold_points=4",
            "model.d_ff=32", "trainer.limit_val_batches=1", "trainer.val_check_interval=2"]


def tts_run(tmp_path):
    import soundfile as sf

    root, rate = tmp_path / "speech", 22_050
    (root / "wavs").mkdir(parents=True)
    # LJSpeech-like ids take fairseq's split: LJ001 test (4 utterances: shares of 2), LJ003 val, the rest train
    ids = [f"LJ001-{i:04d}" for i in range(4)] + ["LJ003-0001"] + [f"LJ004-{i:04d}" for i in range(3)]
    lines = []
    for i, uid in enumerate(ids):
        t = np.arange(int((0.15 + 0.03 * i) * rate)) / rate
        sf.write(root / "wavs" / f"{uid}.wav", (0.3 * np.sin(2 * np.pi * (180 + 35 * i) * t)).astype(np.float32),
                 rate, subtype="PCM_16")
        lines.append(f"{uid}|Tone {i}.|tone {i}.\n")
    (root / "metadata.csv").write_text("".join(lines))
    return ["task=tts", f"data.path={root}", "data.batch_size=2", "model.d_model=16", "model.n_heads=2",
            "model.encoder_layers=1", "model.decoder_layers=1", "model.d_ff=32", "model.conv_channels=8",
            "model.prenet_dim=8", "decode.max_frames=24", "trainer.limit_val_batches=1",
            "trainer.val_check_interval=2"]


def summarization_run(tmp_path):
    data = tmp_path / "news"  # small files: the embedded default reads the whole standard library
    data.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for split, n in (("train", 8), ("val", 2), ("test", 5)):
        # documents of 1-3 words, so the lead (the first words, as many as the summary's) scores
        # differently on different examples and a share's mean differs from the split's
        docs = [[" ".join(words[(i + 3 * d + k) % len(words)] for k in range(1 + (i + d) % 3)) for d in range(2)]
                for i in range(n)]
        (data / f"{split}.src").write_text("".join(" ||||| ".join(pair) + "\n" for pair in docs))
        (data / f"{split}.tgt").write_text("".join(" ".join(doc.split()[0] for doc in pair) + "\n" for pair in docs))
    return ["task=summarization", f"data.path={data}", "data.tokenizer=byte", "data.batch_size=2",
            "model.d_model=16", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
            "model.d_ff=32", "decode.max_len=6", "decode.beam=2", "trainer.limit_val_batches=1",
            "trainer.val_check_interval=2"]


# task -> a function of the test's tmp_path that returns the tiny run's arguments
TINY_RUNS = {"lm": lm_run, "pcc": pcc_run, "summarization": summarization_run, "tsf": tsf_run, "tts": tts_run}


def test_shards_hold_every_item_once_in_order():
    shares = [list(ShardSampler(11, rank=r, world_size=3)) for r in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert [len(ShardSampler(11, rank=r, world_size=3)) for r in range(3)] == [4, 4, 3]
    assert list(ShardSampler(5)) == [0, 1, 2, 3, 4]  # one process: the whole split
    # fewer items than processes: process 0 keeps the first (an LM's prompt comes from it)
    assert [list(ShardSampler(1, rank=r, world_size=2)) for r in range(2)] == [[0], []]
    with pytest.raises(ValueError, match="rank 2 is not in"):
        ShardSampler(4, rank=2, world_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(TINY_RUNS))
def test_test_metrics_are_the_same_on_one_and_two_processes(task, tmp_path):
    run_dir = tmp_path / "run"
    common = ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]
    one = train.run([*TINY_RUNS[task](tmp_path), *common, "trainer.max_steps=2", f"run.dir={run_dir}"])
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.evaluate", f"run.dir={run_dir}", "ckpt=best", *common,
                             "trainer.devices=2", "trainer.strategy=ddp"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (run_dir / "eval").iterdir()
    two = json.loads((folder / "metrics.json").read_text())
    assert two.keys() == one.keys()
    # The same sums in another order: equal to float32 rounding of the model's outputs.
    assert two == pytest.approx(one, rel=1e-5), {k: (one[k], two[k]) for k in one if one[k] != two[k]}
    assert "sync_dist=True" not in result.stderr  # the metrics are summed already; no reminder to sync them


NAN_ON_RANK_1 = """
healthy = tiny.TinyModule.training_step
def nan_on_rank_1(self, batch, batch_idx):
    loss = healthy(self, batch, batch_idx)
    return loss * float("nan") if self.global_rank == 1 and self.global_step >= 2 else loss
tiny.TinyModule.training_step = nan_on_rank_1
"""


@pytest.mark.slow
def test_a_non_finite_loss_on_one_process_stops_every_process(tmp_path):
    """Rank 1's loss turns NaN at step 3 while rank 0's stays finite: the all-reduced
    gradients are NaN on both, and both stop at that step, each with its own line."""
    from test_train_cli import tiny_driver

    driver = tmp_path / "driver.py"
    driver.write_text(tiny_driver(NAN_ON_RANK_1))
    result = subprocess.run([sys.executable, str(driver), "task=tiny", f"run.dir={tmp_path / 'run'}",
                             "trainer.max_steps=8", "trainer.accelerator=cpu", "trainer.devices=2",
                             "trainer.strategy=ddp"], capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    # Each process prints its line (the two may share a line of the captured stream).
    stops = re.findall(r"stopped: the gradients are not finite at step (\d+) \(train_loss (\S+) on this process\)",
                       result.stderr)
    assert [step for step, _ in stops] == ["3", "3"], result.stderr[-3000:]
    finite, nan = sorted(loss for _, loss in stops)  # rank 0's loss, then rank 1's
    assert nan == "nan" and math.isfinite(float(finite)), stops
    assert not (tmp_path / "run" / "metrics.json").exists()
