"""A compiled TTS model's training step: batches padded to the longest utterance, one
graph for every step, the eager step's loss (tests/compiled_step.py)."""

import pytest
import torch

import torch.nn.functional as F

from compiled_step import (assert_few_graphs_and_eager_losses, assert_training_step_sync_free,
                           eval_module_and_first_batch, with_model_output)
from lavo_tasks.config import compose
from lavo_tasks.tasks.tts.data import TTSDataModule, collate
from lavo_tasks.tasks.tts.module import STOP_POSITIVE_WEIGHT
from test_tts_train import TINY, dataset  # noqa: F401 (the fixture)
from tiny import attention_args


@pytest.mark.slow  # compiles a model
def test_compiled_steps_of_different_lengths_compile_a_few_graphs(dataset, tmp_path):
    cfg = compose(["task=tts", "attention=lavo", "attention.window=8", "attention.rank=4", f"data.path={dataset}",
                   f"run.dir={tmp_path / 'run'}", *TINY, "trainer.compile=default"])
    batches = assert_few_graphs_and_eager_losses(cfg, steps=4, most=2)
    data = TTSDataModule(cfg)
    data.setup()
    for key, item_key, lengths, maximum in (("tokens", "tokens", "token_lengths", data.longest[0]),
                                            ("mels", "mel", "mel_lengths", data.longest[1])):
        assert maximum == max(len(d[i][item_key]) for d in data.datasets.values() for i in range(len(d)))
        for batch in batches:  # the next power of two of the batch's longest, at most the data's longest
            longest = int(batch[lengths].max())
            assert batch[key].shape[1] == min(maximum, next(2**k for k in range(32) if 2**k >= longest)), key
    longest = [(int(b["token_lengths"].max()), int(b["mel_lengths"].max())) for b in batches]
    assert len(set(longest)) > 1, longest  # the batches' own lengths differ


def test_bucketed_batches_pad_what_the_batch_longest_would():
    items = [{"tokens": torch.tensor([3, 4, 5]), "mel": torch.ones(3, 2), "index": 0},
             {"tokens": torch.tensor([5]), "mel": torch.full((1, 2), 2.0), "index": 1}]
    bucketed, own = collate(items, maxima=(8, 3)), collate(items)
    assert bucketed["tokens"].shape == (2, 4) and bucketed["mels"].shape == (2, 3, 2)  # 3 -> 4; 3 -> 3, the maximum
    assert bucketed["tokens"][:, 3:].eq(0).all()  # PAD is 0
    assert torch.equal(bucketed["tokens"][:, :3], own["tokens"]) and torch.equal(bucketed["mels"], own["mels"])
    for key in ("token_lengths", "mel_lengths", "index"):
        assert torch.equal(bucketed[key], own[key]), key


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["softmax", "lavo", "gsa"])
def test_training_step_never_waits_for_the_gpu(dataset, tmp_path, attention):
    cfg = compose(["task=tts", f"attention={attention}", *attention_args(attention, window=8, slots=4),
                   f"data.path={dataset}", f"run.dir={tmp_path / 'run'}", *TINY])
    assert_training_step_sync_free(cfg)


def test_stop_loss_is_the_weighted_mean_over_the_real_steps(dataset, tmp_path):
    """The stop loss: binary cross-entropy with pos_weight STOP_POSITIVE_WEIGHT over the
    real decoder steps a boolean mask picks out of the same stop logits (target 1 on each
    utterance's last step)."""
    cfg = compose(["task=tts", f"data.path={dataset}", f"run.dir={tmp_path / 'run'}", *TINY,
                   "model.n_frames_per_step=1"])  # one frame a step: the utterances' steps differ
    module, batch = eval_module_and_first_batch(cfg)
    # the prenet's dropout stays on in eval mode: the stop logits of this very call
    got, (_, _, stop) = with_model_output(module, lambda: module.losses(batch)["stop_loss"])
    steps = -(-batch["mel_lengths"] // module.model.r)  # [B] real decoder steps
    assert len(set(steps.tolist())) > 1  # rows of different lengths
    index = torch.arange(stop.shape[1])
    real = index < steps[:, None]
    target = (index == steps[:, None] - 1).float()
    want = F.binary_cross_entropy_with_logits(stop.float()[real], target[real],
                                              pos_weight=torch.tensor(STOP_POSITIVE_WEIGHT))
    torch.testing.assert_close(got, want)
