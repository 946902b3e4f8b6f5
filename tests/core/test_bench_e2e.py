"""The end-to-end benchmark's harness on the CPU (its timings mean something only on a GPU)."""

import math

import pytest

from lavo_tasks import bench_e2e

SMALL = ["model.d_model=128", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64"]  # head dim 64: rank 64 fits


def test_protocol_model_sizes():
    """The benchmark's LM is docs/design.md §4's: 12 layers of width 768, 12 heads, a
    32,000-token vocabulary, no dropout, and the kernel benchmark's LAVO sizes."""
    model = bench_e2e.build_model("lavo")
    assert len(model.decoder.layers) == 12
    assert tuple(model.embed.weight.shape) == (32000, 768)
    assert model.drop.p == 0.0
    attn = model.decoder.layers[0].self_attn
    assert (attn.window, attn.rank, attn.n_heads) == (128, 64, 12)


@pytest.mark.parametrize("attention", ["softmax", "lavo", "gsa"])
def test_training_throughput_row(attention):
    """Steps train the model: the loss on random tokens starts at ln(V) (the tied head's
    logits start near 0) and falls below it on the batch that every step repeats; the row
    counts B * T tokens per step."""
    model = bench_e2e.build_model(attention, SMALL)
    row = bench_e2e.training_throughput(model, T=16, steps=2, tokens_per_step=32)
    assert (row["B"], row["T"]) == (2, 16)
    assert row["tokens_per_s"] > 0 and row["step_ms"] > 0
    assert math.isclose(row["tokens_per_s"] * row["step_ms"] / 1e3, 32, rel_tol=1e-6)
    assert math.log(32000) - 1 < row["loss"] < math.log(32000) - 0.05


def test_cli_rejects_bad_lengths(capsys):
    with pytest.raises(SystemExit):
        bench_e2e.main(["--lengths", "3000"])
    assert "3000 does not divide 32768" in capsys.readouterr().err
