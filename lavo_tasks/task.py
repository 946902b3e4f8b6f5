"""The contract between a task and the rest of the toolkit.

A task is a package `lavo_tasks.tasks.<name>` (the folder `tasks/<name>/`) with a YAML
file `configs/task/<name>.yaml`; its `__init__.py` exports `TASK = Task(...)`:

- `DataModule(cfg)`: a LightningDataModule. `spec()` returns a plain dict of what the
  model needs from the data (vocabulary, channel counts, scaler, ...), JSON-serialisable,
  computed from the training split; it prepares and sets up whatever that takes, which
  is also where a bad data file fails (before the run folder holds a config.yaml).
- `Module(cfg, spec)`: a `lavo_tasks.module.TaskModule` built from the config and the
  spec alone, never from the DataModule (the runner saves the spec as
  `<run.dir>/spec.json`, and `evaluate` rebuilds the model from config.yaml and it).
  Test data reaches the module only through the test batches.
- `check_config(cfg)`: raises ConfigError naming the first bad task key, before any work.
- `sites`: {site: pattern} of the model's attentions under the task's YAML defaults,
  e.g. {"attention": "CS"} or
  {"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": "NC"}.
  Each site is a config group `model.<site>` holding a whole attention config
  (read it with `lavo_tasks.config.site_attention(cfg, site)`).
- `causal_keys`: {site: boolean config key} for the sites whose causality the config
  chooses, e.g. {"cross_attention": "model.cross_causal"}: the site runs the causal
  pattern (CC / CS) when the key is true, the noncausal one (NC / NS) when false.
  `site_patterns(cfg)` gives every site's pattern for one configuration: what the config
  check asks each site's attention to run, what --help shows and what the report's
  compositional index files a run under. Use `sites` for the site names only.
- `patterns_of`: for a task whose sites change pattern in ways `causal_keys` cannot say
  (mqar's one site is causal self-attention or a cross site, by `data.variant`), a
  function cfg -> {site: pattern} that `site_patterns` returns instead.
- `baselines`: the names of the model-free reference metrics the test reports beside the
  model's (e.g. `test_last_value_mse`), so a reader of metrics.json can tell them apart.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from omegaconf import DictConfig, OmegaConf

from .attention import PATTERN_NAMES

_SITE_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Task:
    name: str
    DataModule: type
    Module: type
    check_config: Callable[[DictConfig], None]
    sites: Mapping[str, str]
    baselines: tuple[str, ...] = field(default=())
    causal_keys: Mapping[str, str] = field(default_factory=dict)
    patterns_of: Callable[[DictConfig], dict[str, str]] | None = None

    def site_patterns(self, cfg: DictConfig) -> dict[str, str]:
        """{site: pattern} this configuration runs (see `causal_keys` and `patterns_of`)."""
        if self.patterns_of is not None:
            return self.patterns_of(cfg)
        patterns = dict(self.sites)
        for site, key in self.causal_keys.items():
            causal = OmegaConf.select(cfg, key)
            if not isinstance(causal, bool):
                raise ValueError(f"{key}={causal!r}: must be true or false")
            patterns[site] = ("C" if causal else "N") + patterns[site][1]
        return patterns

    def __post_init__(self):
        if not self.sites:
            raise ValueError(f"task {self.name!r}: declare at least one attention site")
        for site, pattern in self.sites.items():
            if not _SITE_NAME.fullmatch(site):
                raise ValueError(f"task {self.name!r}: site {site!r} must be a lower-case identifier (model.<site>)")
            if pattern not in PATTERN_NAMES:
                raise ValueError(f"task {self.name!r}: site {site!r} has pattern {pattern!r}; "
                                 f"allowed: {', '.join(PATTERN_NAMES)}")
        for site, key in self.causal_keys.items():
            if site not in self.sites or not isinstance(key, str):
                raise ValueError(f"task {self.name!r}: causal_keys maps a site ({site!r} is not one) to a config key")
        if not isinstance(self.baselines, tuple) or not all(isinstance(b, str) for b in self.baselines):
            raise ValueError(f"task {self.name!r}: baselines must be a tuple of metric names")
        object.__setattr__(self, "sites", MappingProxyType(dict(self.sites)))
        object.__setattr__(self, "causal_keys", MappingProxyType(dict(self.causal_keys)))
