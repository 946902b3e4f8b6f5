"""Multi-query associative recall (`task=mqar`): how much an attention can recall.

Zoology's MQAR (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient
Language Models"): key-value pairs, then queries of some of the keys, scored on the
queried positions only (tasks/mqar/data.py). `data.variant=self` tests the attention as
an LM's causal self-attention, `data.variant=cross` as a decoder's cross-attention to the
encoded pairs (tasks/mqar/model.py). Every run records its decode state size per
sequence and layer (tasks/mqar/state.py) beside the accuracy, so a sweep over window,
rank, slots and width plots recall against state size (lavo_tasks.report).
"""

from pathlib import Path

from omegaconf import DictConfig

from lavo_tasks.config import check_rules
from lavo_tasks.task import Task

from .data import MQARDataModule as DataModule
from .data import check_saved_set, check_sizes
from .module import MQARModule as Module
from .module import recall_site

VARIANTS = ("self", "cross")


def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first MQAR key out of range, before any work."""
    data, model = cfg.data, cfg.model
    check_rules(cfg, [
        ("data.variant", data.variant in VARIANTS, f"one of {', '.join(VARIANTS)}"),
        ("data.val_size", data.val_size >= 1, ">= 1"),
        ("data.test_size", data.test_size >= 1, ">= 1"),
        ("model.n_layers", model.n_layers >= 1, ">= 1"),
        ("model.d_ff", model.d_ff >= 1, ">= 1"),
    ])
    check_sizes(data)
    if data.path and Path(data.path).is_file():  # a missing path: the runner's own error
        check_saved_set(data)


# One site, `model.attention`: the LM's causal self-attention (data.variant=self), or the
# decoder's cross-attention (data.variant=cross: CC or NC, which site_patterns reports).
TASK = Task(name="mqar", DataModule=DataModule, Module=Module, check_config=check_config, sites={"attention": "CS"},
            patterns_of=lambda cfg: {"attention": recall_site(cfg)[0]})

__all__ = ["TASK", "DataModule", "Module", "check_config"]
