"""A compiled summarizer's training step: batches padded to a few lengths, a graph for
each at most, the eager step's loss (tests/compiled_step.py)."""

import pytest
import torch

import torch.nn.functional as F

from compiled_step import (assert_few_graphs_and_eager_losses, assert_training_step_sync_free,
                           eval_module_and_first_batch, with_model_output)
from lavo_tasks.config import compose
from lavo_tasks.tasks.summarization.data import collate
from test_summarization_train import TINY, write_dataset
from tiny import attention_args


def power_of_two_at_least(n: int) -> int:
    return next(2**k for k in range(32) if 2**k >= n)


@pytest.mark.slow  # compiles a model
def test_compiled_steps_of_different_lengths_compile_a_few_graphs(tmp_path):
    data = write_dataset(tmp_path / "data")
    cfg = compose([*TINY, "attention=lavo", "attention.window=4", "attention.rank=4", f"data.path={data}",
                   f"run.dir={tmp_path / 'run'}", "data.max_source_len=96", "data.max_target_len=24",
                   "trainer.compile=default"])
    batches = assert_few_graphs_and_eager_losses(cfg, steps=4, most=2)
    for batch in batches:
        for key, maximum in (("source", 96), ("target", 24)):
            longest = int(batch[f"{key}_mask"].sum(1).max())
            assert batch[key].shape[1] == min(maximum, power_of_two_at_least(longest)), (key, longest)
    assert len({int(b["source_mask"].sum(1).max()) for b in batches}) > 1  # the batches' own lengths differ


def test_bucketed_batches_pad_what_the_batch_longest_would():
    items = [{"source": torch.tensor([5, 6, 7]), "target": torch.tensor([8, 9, 1])},
             {"source": torch.tensor([9]), "target": torch.tensor([1])}]
    bucketed, own = collate(items, eos_id=1, maxima=(8, 3)), collate(items, eos_id=1)
    assert bucketed["source"].tolist() == [[5, 6, 7, 1], [9, 1, 1, 1]]  # 3 -> 4, the next power of two
    assert bucketed["source_mask"].tolist() == [[True] * 3 + [False], [True] + [False] * 3]
    assert bucketed["decoder_input"].tolist() == [[1, 8, 9], [1, 1, 1]]  # 3 -> 3, the maximum
    for key in ("source", "source_mask", "target", "target_mask", "decoder_input"):
        width = own[key].shape[1]
        assert torch.equal(bucketed[key][:, :width], own[key]), key


@pytest.mark.gpu
@pytest.mark.parametrize("cross_causal", [False, True])
@pytest.mark.parametrize("attention", ["softmax", "lavo", "gsa"])
def test_training_step_never_waits_for_the_gpu(tmp_path, attention, cross_causal):
    data = write_dataset(tmp_path / "data")
    cfg = compose([*TINY, f"attention={attention}", *attention_args(attention, window=4, slots=4),
                   f"data.path={data}", f"run.dir={tmp_path / 'run'}", f"model.cross_causal={cross_causal}"])
    assert_training_step_sync_free(cfg)


def test_loss_is_the_mean_over_the_real_target_tokens(tmp_path):
    """training_step's loss (padding ignored by its target, label smoothing 0.1): the
    cross-entropy of the target tokens a boolean mask picks out of the same logits."""
    data = write_dataset(tmp_path / "data")
    cfg = compose([*TINY, f"data.path={data}", f"run.dir={tmp_path / 'run'}", "loss.label_smoothing=0.1"])
    module, batch = eval_module_and_first_batch(cfg)
    mask = batch["target_mask"]
    assert not mask.all()  # the batch has padding
    loss, logits = with_model_output(module, lambda: module.training_step(batch, 0))
    want = F.cross_entropy(logits[mask].float(), batch["target"][mask], label_smoothing=0.1)
    torch.testing.assert_close(loss, want)
