"""A compiled language model's training step: one graph for every step (its windows have
one length), the eager step's loss (tests/compiled_step.py)."""

import pytest

from compiled_step import assert_few_graphs_and_eager_losses
from test_lm import tiny_cfg


@pytest.mark.slow  # compiles a model
def test_compiled_steps_compile_once(tmp_path):
    assert_few_graphs_and_eager_losses(tiny_cfg(tmp_path, "lavo", "trainer.compile=default"))
