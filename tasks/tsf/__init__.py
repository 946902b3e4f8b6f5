"""Long sequence time-series forecasting (`task=tsf`): an Informer-style encoder-decoder.

docs/design.md §3 "Long sequence time-series forecasting": the ETT / Informer CSV layout
(or the embedded gluonts-made default), modes S / M / MS, MSE / MAE on scaled values,
MASE / sMAPE / ND through gluonts, forecast-vs-truth plots.
"""

import pandas as pd
from omegaconf import DictConfig

from lavo_tasks.backbone import size_rules
from lavo_tasks.config import check_rules
from lavo_tasks.errors import ConfigError
from lavo_tasks.task import Task

from .data import MODES, TIME_FEATURES
from .data import TSFDataModule as DataModule
from .module import TSFModule as Module

def check_config(cfg: DictConfig) -> None:
    """ConfigError naming the first forecasting key out of range."""
    data, model = cfg.data, cfg.model
    rules = [
        ("data.mode", data.mode in MODES, f"one of {', '.join(MODES)}"),
        ("data.target", bool(data.target), "a column name"),
        ("data.seq_len", data.seq_len >= 1, ">= 1"),
        ("data.pred_len", data.pred_len >= 1, ">= 1"),
        ("data.label_len", 0 <= data.label_len <= data.seq_len, f"in [0, data.seq_len={data.seq_len}]"),
        *size_rules(cfg),
        ("model.instance_norm", isinstance(model.instance_norm, bool), "true or false"),
        ("model.linear_shortcut", isinstance(model.linear_shortcut, bool), "true or false"),
        ("model.calendar", all(name in TIME_FEATURES for name in model.calendar)
         and len(set(model.calendar)) == len(model.calendar),
         f"a list of distinct names of {', '.join(TIME_FEATURES)}, e.g. [weekday,hour]; [] for none"),
    ]
    check_rules(cfg, rules)
    if data.freq:
        try:
            pd.tseries.frequencies.to_offset(data.freq)
        except ValueError:
            raise ConfigError(f"data.freq={data.freq!r}: not a pandas frequency (e.g. h, 15min, D), or \"\"") from None


# Informer: noncausal encoder, causal decoder, decoder queries over the whole encoder.
# The baselines on the same test windows: repeating the last value, and the linear map
# fitted in closed form on the training windows.
TASK = Task(name="tsf", DataModule=DataModule, Module=Module, check_config=check_config,
            sites={"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": "NC"},
            baselines=("test_last_value_mse", "test_last_value_mae", "test_linear_mse", "test_linear_mae"))

__all__ = ["TASK", "DataModule", "Module", "check_config"]
