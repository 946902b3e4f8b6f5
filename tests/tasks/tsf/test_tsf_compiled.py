"""A compiled forecaster's training step: one graph for every step (its windows have one
length), the eager step's loss (tests/compiled_step.py).

tsf stands for the tasks whose batches have one shape without padding (lm's windows,
mqar's sequences, pcc's resampled clouds): what could still recompile them is Python state
the forward reads (a hook, a counter), which this catches; their blocks' compiled outputs
are checked against eager for every attention and pattern in tests/attention/test_compile.py.
summarization and tts, which pad, have their own tests."""

import pytest

from compiled_step import assert_few_graphs_and_eager_losses, assert_training_step_sync_free
from lavo_tasks.config import compose
from test_tsf import ATTENTION_ARGS, TINY, linear_csv


@pytest.mark.slow  # compiles a model
def test_compiled_steps_compile_once(tmp_path):
    cfg = compose(["task=tsf", *TINY, "attention=lavo", "attention.window=4", "attention.rank=4",
                   f"data.path={linear_csv(tmp_path / 'lin.csv')}", f"run.dir={tmp_path / 'run'}",
                   "trainer.compile=default"])
    assert_few_graphs_and_eager_losses(cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["softmax", "lavo", "gsa"])
def test_training_step_never_waits_for_the_gpu(tmp_path, attention):
    cfg = compose(["task=tsf", *TINY, f"attention={attention}", *ATTENTION_ARGS[attention],
                   f"data.path={linear_csv(tmp_path / 'lin.csv')}", f"run.dir={tmp_path / 'run'}"])
    assert_training_step_sync_free(cfg)
