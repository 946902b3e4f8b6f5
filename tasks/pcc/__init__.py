"""Point cloud completion (`task=pcc`): a PoinTr-style model on the PCN layout.

docs/design.md §3 "Point cloud completion": the PCN layout read with open3d (or the
embedded default of open3d mesh primitives), Chamfer distance (CD-l1, CD-l2) and
F-score@1% as PoinTr defines them, per category too, beside the same figures of the
partial cloud itself; pictures of partial / predicted / true clouds.
"""

from omegaconf import DictConfig

from lavo_tasks.backbone import size_rules
from lavo_tasks.config import check_rules
from lavo_tasks.errors import ConfigError
from lavo_tasks.task import Task

from .data import PCNDataModule as DataModule
from .module import CompletionModule as Module

# Encoder over the proxies, self-attention among the queries, queries over the whole encoder.
SITES = {"encoder_attention": "NS", "query_attention": "NS", "cross_attention": "NC"}


def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first completion key out of range."""
    data, model = cfg.data, cfg.model
    rules = [
        ("data.n_input", data.n_input >= 1, ">= 1"),
        ("data.n_gt", data.n_gt >= 1, ">= 1"),
        ("data.n_gt_eval", data.n_gt_eval >= 1, ">= 1"),
        ("model.n_proxies", model.n_proxies >= 1, ">= 1"),
        ("data.n_input", data.n_input >= model.n_proxies,
         f">= model.n_proxies={model.n_proxies} (the proxies are input points)"),
        ("model.n_neighbors", 1 <= model.n_neighbors <= data.n_input, f"in [1, data.n_input={data.n_input}]"),
        *size_rules(cfg),
        ("model.n_queries", model.n_queries >= 1, ">= 1"),
        ("model.fold_points", model.fold_points >= 1, ">= 1"),
    ]
    check_rules(cfg, rules)
    if not all(isinstance(c, str) and c for c in data.categories):
        raise ConfigError(f"data.categories={list(data.categories)!r}: must be a list of taxonomy ids or names")


TASK = Task(name="pcc", DataModule=DataModule, Module=Module, check_config=check_config, sites=SITES,
            baselines=("test_partial_cd_l1", "test_partial_cd_l2", "test_partial_fscore"))

__all__ = ["TASK"]
