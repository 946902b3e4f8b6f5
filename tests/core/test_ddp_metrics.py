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
"""

import json
import subprocess
import sys

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
    return ["task=tsf", "model.d_model=16", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
            "model.d_ff=32", "data.seq_len=16", "data.label_len=8", "data.pred_len=4", "data.batch_size=64",
            "trainer.limit_val_batches=1", "trainer.val_check_interval=2"]


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
TINY_RUNS = {"lm": lm_run, "summarization": summarization_run, "tsf": tsf_run}


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
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.evaluate", f"run.dir={run_dir}", "ckpt=last", *common,
                             "trainer.devices=2", "trainer.strategy=ddp"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (run_dir / "eval").iterdir()
    two = json.loads((folder / "metrics.json").read_text())
    assert two.keys() == one.keys()
    # The same sums in another order: equal to float32 rounding of the model's outputs.
    assert two == pytest.approx(one, rel=1e-5), {k: (one[k], two[k]) for k in one if one[k] != two[k]}
    assert "sync_dist=True" not in result.stderr  # the metrics are summed already; no reminder to sync them
