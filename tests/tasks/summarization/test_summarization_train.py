"""End-to-end: a few training steps and the test with each attention (tiny model, small
Multi-News files), metrics.json, the summary tables, and evaluate reproducing the run."""

import csv
import json
import math

import pytest
from rouge_score import rouge_scorer

from lavo_tasks import evaluate, train

from compiled_step import assert_whole_compiled_run
from tiny import ATTENTIONS, ENCODER_DECODER, attention_args

TINY = ["task=summarization", *ENCODER_DECODER, "data.tokenizer=byte", "data.batch_size=4",
        "decode.max_len=12", "decode.beam=2", "trainer.max_steps=3", "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2", "trainer.enable_progress_bar=false"]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def write_dataset(folder):
    """Examples of 2-3 documents of a few words; the summary is each document's first word."""
    folder.mkdir(parents=True)
    for split, n in (("train", 24), ("val", 6), ("test", 5)):
        src, tgt = [], []
        for i in range(n):
            docs = [" ".join(WORDS[(i + 3 * d + k) % len(WORDS)] for k in range(4)) for d in range(2 + i % 2)]
            src.append(" ||||| ".join(docs))
            tgt.append(" ".join(doc.split()[0] for doc in docs))
        (folder / f"{split}.src").write_text("\n".join(src) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_train_few_steps_and_test(tmp_path, attention):
    data, run_dir = write_dataset(tmp_path / "data"), tmp_path / attention
    metrics = train.run([*TINY, f"attention={attention}", *attention_args(attention, window=4, slots=5), f"data.path={data}",
                         f"run.dir={run_dir}"])
    names = {"test_loss", "test_generated_len", "test_reference_len",
             *(f"test_{p}rouge{k}" for p in ("", "lead_") for k in ("1", "2", "L"))}
    assert names <= set(metrics) and all(math.isfinite(v) for v in metrics.values())
    assert json.loads((run_dir / "metrics.json").read_text()) == pytest.approx(metrics)
    assert 1 <= metrics["test_generated_len"] <= 12

    # the lead baseline from the files, scored here with rouge-score directly
    sources = (data / "test.src").read_text().splitlines()
    references = (data / "test.tgt").read_text().splitlines()
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    for key in ("rouge1", "rouge2", "rougeL"):
        expected = 0.0
        for source, reference in zip(sources, references):
            lead = " ".join(w for w in source.split() if w != "|||||")
            lead = " ".join(lead.split()[:len(reference.split())])
            expected += scorer.score(reference, lead)[key].fmeasure
        assert metrics[f"test_lead_{key}"] == pytest.approx(100 * expected / len(sources))

    with open(run_dir / "artifacts" / "summaries.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["source (excerpt)", "reference", "lead", "generated"]
    assert [r[1] for r in rows[1:]] == references and [r[0] for r in rows[1:]] == sources
    table = (run_dir / "artifacts" / "summaries.md").read_text()
    header = table.splitlines()[0]
    assert f"{attention}" in header and header.count(", beam 2,") == 1 and table.count("\n| ") == 1 + len(references)
    assert sources[0].replace("|", "\\|") in table


@pytest.mark.slow
def test_evaluate_reproduces_the_test_metrics(tmp_path):
    data, run_dir = write_dataset(tmp_path / "data"), tmp_path / "run"
    metrics = train.run([*TINY, "attention=softmax", f"data.path={data}", f"run.dir={run_dir}", "decode.beam=1",
                         "model.cross_causal=false", "metrics.rouge_stemming=false"])
    assert evaluate.run([f"run.dir={run_dir}"]) == pytest.approx(metrics)


@pytest.mark.gpu
@pytest.mark.parametrize("cross", ["NC", "CC"])
def test_a_whole_run_compiled_with_cuda_graphs(tmp_path, cross):
    data = write_dataset(tmp_path / "data")
    assert_whole_compiled_run([*TINY, "attention=lavo", *attention_args("lavo", window=4, slots=5),
                               f"data.path={data}", f"model.cross_causal={str(cross == 'CC').lower()}"], tmp_path / "run")
