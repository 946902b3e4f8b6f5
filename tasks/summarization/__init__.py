"""Summarization (`task=summarization`): a Transformer encoder-decoder over multi-document sources.

docs/design.md §3 "Summarization": the Multi-News layout or JSON lines (or the embedded
standard-library default), byte / BPE / given tokenizer, label-smoothed training,
greedy and beam-search decoding through the attentions' decode states, ROUGE-1/2/L
with rouge-score beside the lead baseline, a table of generated summaries.
"""

from pathlib import Path

from omegaconf import DictConfig

from lavo_tasks.backbone import size_rules
from lavo_tasks.config import check_rules
from lavo_tasks.errors import ConfigError
from lavo_tasks.generation import check_cuda_graph_key
from lavo_tasks.task import Task
from lavo_tasks.text.tokenizer import check_tokenizer_keys

from .formats import FORMATS, split_files
from .data import SummarizationDataModule as DataModule
from .module import SummarizationModule as Module

# Noncausal encoder, causal decoder; the cross-attention is noncausal (NC) by default and
# causal (CC, as CAB) under model.cross_causal=true (the cab preset sets it).
SITES = {"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": "NC"}
CAUSAL_KEYS = {"cross_attention": "model.cross_causal"}


def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first summarization key out of range."""
    data, model, decode = cfg.data, cfg.model, cfg.decode
    rules = [
        ("data.format", data.format in FORMATS, f"one of {', '.join(FORMATS)}"),
        ("data.source_key", bool(data.source_key), "a key name"),
        ("data.target_key", bool(data.target_key), "a key name"),
        ("data.max_source_len", data.max_source_len >= 1, ">= 1"),
        ("data.max_target_len", data.max_target_len >= 2, ">= 2 (a token and the end token)"),
        *size_rules(cfg),
        ("loss.label_smoothing", 0 <= cfg.loss.label_smoothing < 1, "in [0, 1)"),
        ("decode.beam", decode.beam >= 1, ">= 1 (1: greedy)"),
        ("decode.max_len", decode.max_len >= 1, ">= 1"),
        ("decode.min_len", 0 <= decode.min_len <= decode.max_len, f"in [0, decode.max_len={decode.max_len}]"),
        ("decode.no_repeat_ngram", decode.no_repeat_ngram >= 0, ">= 0 (0: off)"),
    ]
    check_rules(cfg, rules)
    check_cuda_graph_key("decode.cuda_graph", decode.cuda_graph, cfg.trainer.accelerator)
    check_tokenizer_keys(data)
    if data.token_cache and Path(data.token_cache).is_file():
        raise ConfigError(f"data.token_cache={data.token_cache}: a file; it must name a folder (made if missing)")
    if data.path and Path(data.path).exists():  # a missing path: the runner's own error
        split_files(Path(data.path), data.format)  # the layout, before any work; files are read later


TASK = Task(name="summarization", DataModule=DataModule, Module=Module, check_config=check_config, sites=SITES,
            causal_keys=CAUSAL_KEYS, baselines=("test_lead_rouge1", "test_lead_rouge2", "test_lead_rougeL"))

__all__ = ["TASK"]
