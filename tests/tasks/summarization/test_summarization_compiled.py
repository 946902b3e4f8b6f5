"""A compiled summarizer's training step: batches padded to the configured maxima, one
graph for every step, the eager step's loss (tests/compiled_step.py)."""

import pytest
import torch

from compiled_step import assert_one_graph_and_eager_losses
from lavo_tasks.config import compose
from lavo_tasks.tasks.summarization.data import collate
from test_summarization_train import TINY, write_dataset


@pytest.mark.slow  # compiles a model
def test_compiled_steps_of_different_lengths_compile_once(tmp_path):
    data = write_dataset(tmp_path / "data")
    cfg = compose([*TINY, "attention=lavo", "attention.window=4", "attention.rank=4", f"data.path={data}",
                   f"run.dir={tmp_path / 'run'}", "data.max_source_len=96", "data.max_target_len=24",
                   "trainer.compile=default"])
    batches = assert_one_graph_and_eager_losses(cfg)
    assert {tuple(b["source"].shape) for b in batches} == {(4, 96)}
    assert {tuple(b["target"].shape) for b in batches} == {(4, 24)}
    longest = [int(b["source_mask"].sum(1).max()) for b in batches]
    assert len(set(longest)) > 1 and max(longest) < 96, longest  # the batches' own lengths differ


def test_fixed_lengths_pad_what_the_batch_longest_would():
    items = [{"source": torch.tensor([5, 6, 7]), "target": torch.tensor([8, 1])},
             {"source": torch.tensor([9]), "target": torch.tensor([1])}]
    fixed, own = collate(items, eos_id=1, lengths=(5, 4)), collate(items, eos_id=1)
    assert fixed["source"].tolist() == [[5, 6, 7, 1, 1], [9, 1, 1, 1, 1]]
    assert fixed["source_mask"].tolist() == [[True] * 3 + [False] * 2, [True] + [False] * 4]
    assert fixed["decoder_input"].tolist() == [[1, 8, 1, 1], [1, 1, 1, 1]]
    assert fixed["target_mask"].tolist() == [[True, True, False, False], [True, False, False, False]]
    for key in ("source", "source_mask", "target", "target_mask", "decoder_input"):
        width = own[key].shape[1]
        assert torch.equal(fixed[key][:, :width], own[key]), key
