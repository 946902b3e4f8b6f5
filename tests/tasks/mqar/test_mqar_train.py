"""`task=mqar` end to end on a tiny config: the metrics, recomputed independently, and the data."""

import json

import pytest
import torch

from lavo_tasks import train
from lavo_tasks.tasks.mqar.model import RecallModel
from lavo_tasks.config import compose

from compiled_step import (assert_training_step_sync_free, assert_whole_compiled_run, eval_module_and_first_batch,
                           with_model_output)
from test_mqar_data import TINY, TINY_ATTENTION, check_construction, tiny_cfg


@pytest.mark.parametrize("variant,attention", [("self", "softmax"), ("cross", "lavo")])
def test_train_and_test_end_to_end(tmp_path, variant, attention):
    run = tmp_path / "run"
    args = ["task=mqar", f"attention={attention}", *TINY_ATTENTION[attention], *TINY, f"data.variant={variant}",
            "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false",
            f"run.dir={run}"]
    assert train.main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())

    saved = torch.load(run / "mqar_set.pt", weights_only=True)
    inputs, targets = saved["test"]
    assert inputs.shape == (10, 24)  # data.test_size sequences of data.seq_len
    check_construction(inputs, targets, 32, 5, 3)

    # The accuracy, recounted query by query from the tested weights (best.ckpt).
    cfg = compose(args)
    model = RecallModel(32, 5, variant, cfg.model, cfg.model.attention)
    state = torch.load(run / "checkpoints" / "best.ckpt", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    with torch.no_grad():
        logits = model.eval()(inputs)
    hits = [int(logits[b, t].argmax() == targets[b, t]) for b in range(10) for t in range(24) if targets[b, t] >= 0]
    assert len(hits) == 10 * 3
    assert metrics["test_acc"] == pytest.approx(sum(hits) / len(hits))
    assert metrics["test_decode_acc"] == metrics["test_acc"]
    d_model = 16
    expected_state = 2 * 24 * d_model if attention == "softmax" else 4 * 2  # softmax KV cache; lavo NC: rank x heads
    assert metrics["test_state_size"] == expected_state


@pytest.mark.parametrize("variant", ["self", "cross"])
def test_training_loss_is_the_mean_nll_of_the_queried_positions(tmp_path, variant):
    """training_step's loss (unqueried positions ignored by their target): the mean NLL of
    the queried positions that `scored` picks out of the same logits with a mask."""
    module, batch = eval_module_and_first_batch(tiny_cfg(tmp_path, f"data.variant={variant}"))
    loss, logits = with_model_output(module, lambda: module.training_step(batch, 0))
    nll, _ = module.scored(logits, batch[1])
    assert nll.numel() == 4 * 3  # data.batch_size sequences of data.num_queries queries
    torch.testing.assert_close(loss, nll.mean())


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["softmax", "lavo", "gsa"])
def test_training_step_never_waits_for_the_gpu(tmp_path, attention):
    assert_training_step_sync_free(tiny_cfg(tmp_path, f"attention={attention}", *TINY_ATTENTION[attention],
                                            "data.variant=cross"))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["self", "cross"])
def test_a_whole_run_compiled_with_cuda_graphs(tmp_path, variant):
    metrics = assert_whole_compiled_run(["task=mqar", "attention=lavo", *TINY_ATTENTION["lavo"], *TINY,
                                         f"data.variant={variant}", "trainer.max_steps=3",
                                         "trainer.val_check_interval=3", "trainer.enable_progress_bar=false"],
                                        tmp_path / "run")
    assert 0 <= metrics["test_acc"] <= 1
