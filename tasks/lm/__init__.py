"""Language modeling (`task=lm`): a decoder-only Transformer over a token stream.

docs/design.md §3 "Language modeling": PG-19 or plain text files (or the embedded
standard-library corpus), byte / BPE / given tokenizer, perplexity at the training
length and at 2x, 4x, 8x, text generated through the attentions' decode states.
"""

from pathlib import Path

from omegaconf import DictConfig

from lavo_tasks.backbone import size_rules
from lavo_tasks.config import check_rules
from lavo_tasks.errors import ConfigError
from lavo_tasks.generation import check_cuda_graph_key
from lavo_tasks.task import Task
from lavo_tasks.text.tokenizer import check_tokenizer_keys

from .data import LMDataModule as DataModule
from .data import TEST_LENGTH_FACTORS, split_files
from .module import LMModule as Module

MIN_SEQ_LEN = 8


def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first LM key out of range."""
    longest = max(TEST_LENGTH_FACTORS) * cfg.data.seq_len
    rules = [
        ("data.seq_len", cfg.data.seq_len >= MIN_SEQ_LEN, f">= {MIN_SEQ_LEN}"),
        *size_rules(cfg),
        ("generate.prompt_tokens", 1 <= cfg.generate.prompt_tokens <= longest + 1,
         f"in [1, {longest + 1}] (the prompt is the start of the test split's first {max(TEST_LENGTH_FACTORS)}x block)"),
        ("generate.max_new_tokens", cfg.generate.max_new_tokens >= 1, ">= 1"),
        ("generate.temperature", cfg.generate.temperature >= 0, ">= 0 (0: greedy)"),
        ("generate.top_k", cfg.generate.top_k >= 0, ">= 0 (0: the whole vocabulary)"),
    ]
    check_rules(cfg, rules)
    check_cuda_graph_key("generate.cuda_graph", cfg.generate.cuda_graph, cfg.trainer.accelerator)
    check_tokenizer_keys(cfg.data)
    if cfg.data.token_cache and Path(cfg.data.token_cache).is_file():
        raise ConfigError(f"data.token_cache={cfg.data.token_cache}: a file; it must name a folder (made if missing)")
    if cfg.data.path and Path(cfg.data.path).exists():  # a missing path: the runner's own error
        split_files(Path(cfg.data.path))  # the layout, before any work; files are read later


# Decoder-only: one site, `model.attention`, the causal self-attention of every layer.
TASK = Task(name="lm", DataModule=DataModule, Module=Module, check_config=check_config, sites={"attention": "CS"})

__all__ = ["TASK", "DataModule", "Module", "check_config"]
