"""A compiled TTS model's training step: batches padded to the longest utterance, one
graph for every step, the eager step's loss (tests/compiled_step.py)."""

import pytest
import torch

from compiled_step import assert_one_graph_and_eager_losses
from lavo_tasks.config import compose
from lavo_tasks.tasks.tts.data import collate
from test_tts_train import TINY, dataset  # noqa: F401 (the fixture)


@pytest.mark.slow  # compiles a model
def test_compiled_steps_of_different_lengths_compile_once(dataset, tmp_path):
    cfg = compose(["task=tts", "attention=lavo", "attention.window=8", "attention.rank=4", f"data.path={dataset}",
                   f"run.dir={tmp_path / 'run'}", *TINY, "trainer.compile=default"])
    batches = assert_one_graph_and_eager_losses(cfg)
    assert len({b["mels"].shape for b in batches}) == len({b["tokens"].shape for b in batches}) == 1
    longest = [(int(b["token_lengths"].max()), int(b["mel_lengths"].max())) for b in batches]
    assert len(set(longest)) > 1, longest  # the batches' own lengths differ


def test_fixed_lengths_pad_what_the_batch_longest_would():
    items = [{"tokens": torch.tensor([3, 4]), "mel": torch.ones(3, 2), "index": 0},
             {"tokens": torch.tensor([5]), "mel": torch.full((1, 2), 2.0), "index": 1}]
    fixed, own = collate(items, lengths=(4, 5)), collate(items)
    assert fixed["tokens"].shape == (2, 4) and fixed["mels"].shape == (2, 5, 2)
    assert fixed["tokens"][:, 2:].eq(0).all() and fixed["mels"][:, 3:].eq(0).all()  # PAD is 0
    assert torch.equal(fixed["tokens"][:, :2], own["tokens"]) and torch.equal(fixed["mels"][:, :3], own["mels"])
    for key in ("token_lengths", "mel_lengths", "index"):
        assert torch.equal(fixed[key], own[key]), key
