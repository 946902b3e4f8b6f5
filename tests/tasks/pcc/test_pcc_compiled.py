"""A compiled point-cloud completer's training step: one graph for every step (its clouds
are resampled to fixed counts), the eager step's loss (tests/compiled_step.py)."""

import pytest

from compiled_step import assert_few_graphs_and_eager_losses
from lavo_tasks.config import compose
from pcn_layout import SMALL, write_layout
from test_pcc_train import TINY


@pytest.mark.slow  # compiles a model
def test_compiled_steps_compile_once(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    cfg = compose(["task=pcc", "attention=gsa", "attention.slots=8", f"data.path={root}", f"run.dir={tmp_path / 'run'}",
                   *TINY, "trainer.compile=default"])
    assert_few_graphs_and_eager_losses(cfg)
