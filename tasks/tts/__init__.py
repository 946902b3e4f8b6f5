"""Text-to-speech (`task=tts`): Transformer-TTS on the LJSpeech layout.

docs/design.md §3 "Text-to-speech": the LJSpeech layout (or the embedded default spoken by
espeak-ng), characters or phonemes, 80-band log-mels, autoregressive decoding with every
attention's decode state, Griffin-Lim audio, MCD / MSD as fairseq's eval_sp computes them.
"""

from omegaconf import DictConfig

from lavo_tasks.attention.base import is_int
from lavo_tasks.backbone import size_rules
from lavo_tasks.config import check_rules, site_attention
from lavo_tasks.generation import check_cuda_graph_key
from lavo_tasks.task import Task

from .audio import MelConfig
from .data import TTSDataModule as DataModule
from .module import TTSModule as Module
from .text import FRONTENDS

# Transformer-TTS as CAB runs it: noncausal text encoder, causal mel decoder, and causal
# cross-attention (decoder step t reads text positions <= t); model.cross_causal=false
# runs the cross-attention NC instead.
SITES = {"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": "CC"}
CAUSAL_KEYS = {"cross_attention": "model.cross_causal"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rate(value) -> bool:
    """auto, or a number > 0 (the command line gives a number to this string key as text)."""
    try:
        return value == "auto" or float(value) > 0
    except ValueError:
        return False


def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first text-to-speech key out of range."""
    data, model, decode = cfg.data, cfg.model, cfg.decode
    min_rate = int(2 * MelConfig.f_max)
    rules = [
        ("data.frontend", data.frontend in FRONTENDS, f"one of {', '.join(FRONTENDS)}"),
        ("data.sample_rate", is_int(data.sample_rate) and data.sample_rate >= min_rate,
         f"an integer number of Hz >= {min_rate} (the mels reach {MelConfig.f_max:g} Hz)"),
        *size_rules(cfg),
        ("model.conv_channels", model.conv_channels >= 1, ">= 1"),
        ("model.prenet_dim", model.prenet_dim >= 1, ">= 1"),
        ("model.n_frames_per_step", model.n_frames_per_step >= 1, ">= 1"),
        ("model.text_position_rate", _rate(model.text_position_rate),
         "auto or a number > 0"),
        ("model.guided_attention", _number(model.guided_attention) and model.guided_attention >= 0, "a number >= 0"),
        ("model.guided_attention", not model.guided_attention or site_attention(cfg, "cross_attention").name == "softmax",
         "0 unless the cross-attention is softmax (the only block that forms its weights)"),
        ("decode.max_frames", decode.max_frames >= 1, ">= 1"),
        ("decode.stop_threshold", 0 < decode.stop_threshold < 1, "in (0, 1)"),
    ]
    check_rules(cfg, rules)
    check_cuda_graph_key("decode.cuda_graph", decode.cuda_graph, cfg.trainer.accelerator)


TASK = Task(name="tts", DataModule=DataModule, Module=Module, check_config=check_config, sites=SITES,
            causal_keys=CAUSAL_KEYS, baselines=("test_baseline_mcd", "test_baseline_msd"))

__all__ = ["TASK"]
