"""The tasks. Each is a subpackage `lavo_tasks.tasks.<name>` with a YAML file
`configs/task/<name>.yaml`, and exports:

- `DataModule(cfg)`: a LightningDataModule; the runner calls `prepare_data()` and
  `setup(stage)` before it builds the module (so vocabularies, channel counts, ... are known);
- `Module(cfg, datamodule)`: a `lavo_tasks.module.TaskModule`;
- `check_config(cfg)`: raises ConfigError for a bad task key (before any work).
- `ATTENTION_SITES`: {site: pattern} of the model's attentions, e.g. {"attention": "CS"}
  for a decoder-only model, or {"encoder_attention": "NS", "decoder_attention": "CS",
  "cross_attention": "NC"} (see `lavo_tasks.config.site_attention`); the config check
  asks each site's attention whether it can run that pattern, before any work.

Adding a task touches no other task: the runner finds it by name.
"""

import importlib
from importlib import resources
from types import ModuleType

from ..errors import ConfigError


def task_names() -> list[str]:
    folder = resources.files("lavo_tasks.configs") / "task"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_task(name: str) -> ModuleType:
    if name not in task_names():
        raise ConfigError(f"task={name!r}: unknown task; allowed: {', '.join(task_names())}")
    return importlib.import_module(f"lavo_tasks.tasks.{name}")
