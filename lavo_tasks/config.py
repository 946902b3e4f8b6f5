"""A run's configuration: compose the YAML files and the command line, check it, resolve it.

`compose(args)` layers configs/train.yaml, configs/task/<task>.yaml and the task's
preset, then fills each attention site the task declares (`Task.sites`) with a whole
attention config, `model.<site>: {name: lavo, window: 32, ...}` from
configs/attention/<name>.yaml, and applies the `a.b=value` arguments:

- `attention=NAME` selects NAME for every site (default: what the task YAML names for
  the site, else softmax); `model.<site>=NAME` selects one site's attention;
- a task YAML's `attention_options.NAME.KEY: VALUE` sets KEY at every site whose
  attention is NAME, over configs/attention/NAME.yaml (the task's own default, e.g.
  summarization's ALiBi for softmax); the command line's keys below win;
- `attention.KEY=VALUE` sets KEY at every site whose attention is the one `attention=`
  selected; `model.<site>.KEY=VALUE` sets it at one site;
- any other key must already exist in those files and keeps its type.

So a misspelt key, an unknown site or a wrong value fails here, before any work, with a
ConfigError whose one-line message names the key and what is allowed. The composed
config holds every site's full attention config, so a saved config.yaml rebuilds the
model whatever the installed YAML files say later. `validate(cfg)` then checks ranges
(each site's attention against its pattern, the task, trainer and optimiser basics,
data.path).

The composition is written here rather than through hydra-core: the selectors above are
a few lines on top of OmegaConf, hydra's override grammar would spell a site's group
`model/cross_attention=lavo` beside `model.cross_attention.window=64`, and its errors
are multi-line reports rather than this project's one line naming the key.
"""

import difflib
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import get_args

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from . import tasks
from .attention import ATTENTION_NAMES, PATTERN_NAMES, block_class, check_attention_config
from .errors import ConfigError
from .compiling import COMPILE_MODES, compile_mode

DEFAULT_ATTENTION = "softmax"
SELECTORS = ("task", "attention")
# Keys a resumed run may change: the saved configuration is otherwise what built the checkpoint.
RESUMABLE_PREFIXES = ("trainer.", "run.")
# Keys `evaluate` may change: how the test runs, not the model a checkpoint holds.
TEST_KEYS = ("data.path", "data.batch_size", "data.num_workers", "trainer.limit_test_batches",
             "trainer.precision", "trainer.accelerator", "trainer.devices", "trainer.strategy",
             "trainer.enable_progress_bar")
TEST_PREFIXES = ("decode.", "generate.")

_INT = re.compile(r"[+-]?\d+")
_DURATION = re.compile(r"\d+:\d+:\d+:\d+")  # lightning.Trainer's max_time, DD:HH:MM:SS


def read_yaml(relative_path: str) -> DictConfig:
    """A YAML file shipped in lavo_tasks.configs (works installed and editable)."""
    text = (resources.files("lavo_tasks.configs") / relative_path).read_text(encoding="utf-8")
    return OmegaConf.create(text)


def task_yaml(name: str) -> DictConfig:
    return OmegaConf.create(tasks.task_yaml_text(name))


def attention_defaults(name: str, key: str = "attention") -> DictConfig:
    """The `attention` group of configs/attention/<name>.yaml; `key` names the argument
    that chose it, for the error."""
    if name not in ATTENTION_NAMES:
        raise ConfigError(f"{key}={name!r}: unknown attention; allowed: {', '.join(ATTENTION_NAMES)}")
    return read_yaml(f"attention/{name}.yaml").attention


def split_args(args: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split `task=NAME attention=NAME a.b=value ...` into the selectors and the
    (key, raw text) overrides, in order."""
    selectors, overrides = {}, []
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key or key != key.strip():
            raise ConfigError(f"argument {arg!r}: expected key=value, e.g. trainer.max_steps=100")
        if key in SELECTORS:
            selectors[key] = raw
        else:
            overrides.append((key, raw))
    return selectors, overrides


def compose(args: list[str]) -> DictConfig:
    """The resolved configuration of a run from its command-line arguments.

    With `run.resume` set, the base is the saved config.yaml of `run.dir` instead of the
    YAML files, and only trainer.* and run.* keys may change.
    """
    selectors, overrides = split_args(args)
    given = dict(overrides)
    if given.get("run.resume", "").strip():
        cfg = _saved_config(given.get("run.dir", ""), selectors, overrides)
    else:
        cfg = _fresh_config(selectors, overrides)
    OmegaConf.resolve(cfg)
    if cfg.data.path:  # saved absolute, so evaluate and resume work from any directory
        cfg.data.path = str(Path(cfg.data.path).expanduser().absolute())
    OmegaConf.set_struct(cfg, True)
    return cfg


def _fresh_config(selectors: dict[str, str], overrides: list[tuple[str, str]]) -> DictConfig:
    cfg = read_yaml("train.yaml")
    name = selectors.get("task", cfg.task)
    cfg = OmegaConf.merge(cfg, task_yaml(name), {"task": name})
    task = tasks.load_task(name)
    presets = cfg.pop("presets", OmegaConf.create({}))
    preset = dict(overrides).get("model.preset")
    if preset is not None:
        _check_known(cfg, "model.preset")
        cfg = _apply_preset(cfg, presets, parse_value("model.preset", preset, cfg.model.preset))
    elif OmegaConf.select(cfg, "model.preset") is not None:
        cfg = _apply_preset(cfg, presets, cfg.model.preset)

    chosen = selectors.get("attention")
    if chosen is not None:
        attention_defaults(chosen)  # an unknown name fails as attention=NAME
    names = {site: _site_default(cfg, site, chosen) for site in task.sites}
    keys = []
    for key, raw in overrides:
        site = key.removeprefix("model.")
        if key.startswith("model.") and site in task.sites:
            names[site] = raw.strip("'\"") or chosen or DEFAULT_ATTENTION
        else:
            keys.append((key, raw))
    if "model" not in cfg:
        cfg.model = {}
    options = _task_attention_options(cfg)
    for site, attention in names.items():
        cfg.model[site] = OmegaConf.merge(attention_defaults(attention, key=f"model.{site}"),
                                          options.get(attention, {}))

    for key, raw in keys:
        if key == "attention.name":
            raise ConfigError(f"attention.name={raw!r}: choose the attention with attention=NAME "
                              f"(one of {', '.join(ATTENTION_NAMES)})")
        if key.startswith("attention."):
            _set_every_site(cfg, task.sites, chosen or DEFAULT_ATTENTION, key, raw)
        else:
            set_key(cfg, key, raw, task.sites)
    return cfg


def _task_attention_options(cfg: DictConfig) -> dict:
    """The task YAML's `attention_options` group, taken out of `cfg`: {attention name:
    {key: value}}, each name a registered attention and each key one of its YAML's keys."""
    options = cfg.pop("attention_options", None)
    if options is None:
        return {}
    where = f"in configs/task/{cfg.task}.yaml"
    if not isinstance(options, DictConfig):
        raise ConfigError(f"attention_options {where}: must be a group of attention names")
    for name, keys in options.items():
        if name not in ATTENTION_NAMES:
            raise ConfigError(f"attention_options.{name} {where}: unknown attention; allowed: "
                              f"{', '.join(ATTENTION_NAMES)}")
        defaults = attention_defaults(name)
        if not isinstance(keys, DictConfig):
            raise ConfigError(f"attention_options.{name} {where}: must be a group of keys of attention {name}")
        for key in keys:
            if key == "name" or key not in defaults:
                allowed = ", ".join(k for k in defaults if k != "name") or "none"
                raise ConfigError(f"attention_options.{name}.{key} {where}: not a key of attention {name!r}; "
                                  f"its keys: {allowed}")
    return {name: keys for name, keys in options.items()}


def _site_default(cfg: DictConfig, site: str, chosen: str | None) -> str:
    """The attention a site starts from: `attention=` when given, else the name the task
    YAML writes at model.<site> ("" or absent: softmax)."""
    written = OmegaConf.select(cfg, f"model.{site}", default="")
    if not isinstance(written, str):
        raise ConfigError(f"model.{site} in configs/task/{cfg.task}.yaml: must be an attention name or \"\" "
                          f"(the site's keys come from configs/attention/)")
    return chosen or written or DEFAULT_ATTENTION


def _set_every_site(cfg: DictConfig, sites, chosen: str, key: str, raw: str) -> None:
    """`attention.KEY=VALUE`: KEY at every site whose attention is `chosen`."""
    defaults = attention_defaults(chosen)
    name = key.removeprefix("attention.")
    if name not in defaults:
        raise ConfigError(f"unknown key {key!r}; keys of attention: {', '.join(defaults)}")
    targets = [site for site in sites if cfg.model[site].name == chosen]
    if not targets:
        where = ", ".join(f"model.{site}={cfg.model[site].name}" for site in sites)
        raise ConfigError(f"{key}={raw!r}: no site uses attention={chosen} ({where}); "
                          f"set model.<site>.{name}=... instead")
    value = parse_value(key, raw, defaults[name])
    for site in targets:
        cfg.model[site][name] = value


def _apply_preset(cfg: DictConfig, presets: DictConfig, preset: str) -> DictConfig:
    """`cfg` with `presets.<preset>` of the task YAML merged over it. A preset may set any
    existing key: the model sizes and the data keys that go with them (CAB's LM preset
    sets data.seq_len too); "default" is the task YAML as written. The command line's
    keys are applied afterwards, so they win."""
    if preset != "default" and preset not in presets:
        allowed = ", ".join(["default", *presets])
        raise ConfigError(f"model.preset={preset!r}: unknown preset for task {cfg.task}; allowed: {allowed}")
    if preset not in presets:
        return cfg
    entries = presets[preset]
    for key in _all_keys(entries):
        if not isinstance(OmegaConf.select(entries, key), DictConfig):
            _check_known(cfg, key, where=f"presets.{preset}.{key} in configs/task/{cfg.task}.yaml")
    return OmegaConf.merge(cfg, entries)


def load_run_config(run_dir: str, command: str) -> DictConfig:
    """The saved config.yaml of the run in `run_dir`, which `command` (resume, evaluate)
    needs; ConfigError when there is no such run."""
    if not run_dir:
        raise ConfigError(f"run.dir: missing; {command} needs run.dir=<a run folder>")
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"run.dir={run_dir!r}: no config.yaml there, so no run to {command}")
    return OmegaConf.load(path)


def _saved_config(run_dir: str, selectors: dict[str, str], overrides: list[tuple[str, str]]) -> DictConfig:
    cfg = load_run_config(run_dir, "resume")
    sites = tasks.load_task(cfg.task).sites
    used = sorted({cfg.model[site].name for site in sites})
    saved = {"task": cfg.task,
             "attention": used[0] if len(used) == 1 else ", ".join(f"model.{s}={cfg.model[s].name}" for s in sites)}
    for name, value in selectors.items():
        if value != saved[name]:
            raise ConfigError(f"{name}={value!r}: a resumed run keeps its {name} ({saved[name]})")
    for key, raw in overrides:
        if not key.startswith(RESUMABLE_PREFIXES):
            raise ConfigError(f"{key}: a resumed run keeps its configuration; only trainer.* and run.* keys may change")
        set_key(cfg, key, raw)
    return cfg


def compose_evaluation(args: list[str]) -> tuple[DictConfig, str, dict]:
    """The configuration of `evaluate` from its arguments `run.dir=<run> [ckpt=...]
    [key=value ...]`: the run's saved config.yaml with the test-time keys changed.
    Returns (cfg, ckpt, {changed key: its new value})."""
    selectors, overrides = split_args(args)
    if selectors:
        name = next(iter(selectors))
        raise ConfigError(f"{name}={selectors[name]!r}: evaluate keeps the run's {name}")
    given = dict(overrides)
    run_dir = given.pop("run.dir", "")
    ckpt = given.pop("ckpt", "last")
    for key in given:
        if key not in TEST_KEYS and not key.startswith(TEST_PREFIXES):
            raise ConfigError(f"{key}: evaluate keeps the run's model and training keys; it may change "
                              f"{', '.join(TEST_KEYS)}, {', '.join(p + '*' for p in TEST_PREFIXES)}")
    cfg = load_run_config(run_dir, "evaluate")
    OmegaConf.set_struct(cfg, True)
    cfg.run.dir = run_dir  # the folder as given now, wherever the run was trained
    for key, raw in given.items():
        set_key(cfg, key, raw)
    if given.get("data.path"):  # absolute, as compose saves it
        cfg.data.path = str(Path(cfg.data.path).expanduser().absolute())
    return cfg, ckpt, {key: OmegaConf.select(cfg, key) for key in given}


def _all_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key, value in cfg.items_ex(resolve=False):
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, DictConfig):
            keys.extend(_all_keys(value, path + "."))
    return keys


def _check_known(cfg: DictConfig, key: str, where: str = "") -> None:
    parent_path, _, name = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
    if isinstance(parent, DictConfig) and name in parent:
        return
    known = _all_keys(cfg)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    if not close:
        group, where_keys = (parent, parent_path) if isinstance(parent, DictConfig) else (cfg, "the root")
        hint = f"; keys of {where_keys or 'the root'}: {', '.join(str(k) for k in group)}"
    source = f" ({where})" if where else ""
    raise ConfigError(f"unknown key {key!r}{source}{hint}")


def set_key(cfg: DictConfig, key: str, raw: str, sites=()) -> None:
    """Set `key` (which must exist) to `raw`, the command line's text, converted to the
    type of its current value; ConfigError naming the key when it does not exist or the
    text does not parse. `sites`: the task's attention sites, so that `model.<site>.KEY`
    is checked against the site's attention."""
    parts = key.split(".")
    if parts[0] == "model" and len(parts) > 1 and parts[1] in sites:
        _check_site_key(cfg, parts[1], key, raw)
    elif parts[0] == "model" and len(parts) > 1 and parts[1] not in cfg.get("model", {}) and (
            len(parts) > 2 or parts[1].endswith("attention")):
        close = difflib.get_close_matches(parts[1], list(sites), n=1, cutoff=0.75)
        hint = f" (did you mean model.{close[0]}?)" if close else ""
        raise ConfigError(f"unknown attention site 'model.{parts[1]}' of task {cfg.task}{hint}; its sites: "
                          f"{', '.join(f'model.{s}' for s in sites)}")
    _check_known(cfg, key)
    OmegaConf.update(cfg, key, parse_value(key, raw, OmegaConf.select(cfg, key)), merge=False)


def _check_site_key(cfg: DictConfig, site: str, key: str, raw: str) -> None:
    """`model.<site>.KEY`: KEY must be a key of the site's attention other than its name."""
    attention = cfg.model[site]
    name = key.split(".", 2)[2] if key.count(".") >= 2 else ""
    if name == "name":
        raise ConfigError(f"{key}={raw!r}: choose a site's attention with model.{site}=NAME "
                          f"(one of {', '.join(ATTENTION_NAMES)})")
    keys = [k for k in attention if k != "name"]
    if name not in keys:
        allowed = f"its keys: {', '.join(keys)}" if keys else "it has no keys to set"
        raise ConfigError(f"unknown key {key!r}: model.{site} is attention {attention.name}; {allowed}")


def parse_value(key: str, raw: str, default):
    """`raw` as a value of the default's type: bool, int, float (an int is accepted as
    is), str (taken verbatim), a list, or anything when the default is null."""
    what = f"{key}={raw!r}"
    if isinstance(default, DictConfig):
        raise ConfigError(f"{what}: {key} is a group of keys; set one of them, e.g. {key}.{next(iter(default), 'x')}=...")
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"{what}: expected true or false")
        return raw.lower() == "true"
    if isinstance(default, int):
        if not _INT.fullmatch(raw.strip()):
            raise ConfigError(f"{what}: expected an integer (default {default})")
        return int(raw)
    if isinstance(default, float):
        if _INT.fullmatch(raw.strip()):
            return int(raw)
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{what}: expected a number (default {default})") from None
    if isinstance(default, str):
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            return raw[1:-1]
        return raw
    value = OmegaConf.from_dotlist([f"value={raw}"]).value
    if isinstance(default, ListConfig) and not isinstance(value, ListConfig):
        raise ConfigError(f"{what}: expected a list, e.g. {key}=[1,2]")
    return value


def _check_site(cfg: DictConfig, site: str, pattern: str) -> None:
    """The attention at `model.<site>` can run the site's pattern with these values (an
    odd window in noncausal self-attention, say, fails here)."""
    attention = site_attention(cfg, site)
    block = block_class(attention.name)
    if pattern not in block.patterns:
        supported = ", ".join(f"{p} ({PATTERN_NAMES[p]})" for p in sorted(block.patterns))
        raise ConfigError(f"model.{site}={attention.name}: attention {attention.name!r} does not support "
                          f"{PATTERN_NAMES[pattern]} ({pattern}), which this site needs; it supports: {supported}; "
                          f"set model.{site} to another attention")
    try:
        check_attention_config(attention, cfg.model.d_model, cfg.model.n_heads, pattern)
    except ConfigError as err:
        message = str(err)
        if message.startswith("attention."):  # the block names its own keys: say which site's
            raise ConfigError(f"model.{site}.{message.removeprefix('attention.')}") from None
        raise


def site_attention(cfg: DictConfig, site: str) -> DictConfig:
    """The whole attention config of one attention site, `model.<site>` (a task's sites
    are its `Task.sites`; the LM's one site is `attention`)."""
    attention = OmegaConf.select(cfg, f"model.{site}")
    if not isinstance(attention, DictConfig) or "name" not in attention:
        sites = [key for key, value in cfg.model.items() if isinstance(value, DictConfig) and "name" in value]
        raise ValueError(f"model.{site}: not an attention site of task {cfg.task}; its sites: {', '.join(sites)}")
    return attention


def validate(cfg: DictConfig) -> None:
    """Range checks after `compose`; raises ConfigError naming the first bad key."""
    _check_basics(cfg)
    task = tasks.load_task(cfg.task)
    for site, pattern in task.site_patterns(cfg).items():
        _check_site(cfg, site, pattern)
    task.check_config(cfg)
    if cfg.data.path and not Path(cfg.data.path).expanduser().exists():
        raise ConfigError(f"data.path={cfg.data.path!r}: no such file or folder")


def _check_basics(cfg: DictConfig) -> None:
    rules = [
        ("trainer.max_steps", lambda v: v >= 1, ">= 1"),
        ("trainer.val_check_interval", lambda v: v >= 1, "a number of steps >= 1"),
        ("run.checkpoint_every", lambda v: v >= 0, "a number of steps >= 0 (0: off)"),
        ("optim.lr", lambda v: v > 0, "> 0"),
        ("optim.weight_decay", lambda v: v >= 0, ">= 0"),
        ("optim.warmup_steps", lambda v: v >= 0, ">= 0"),
        ("optim.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("optim.grad_clip", lambda v: v >= 0, ">= 0 (0: no clipping)"),
        ("data.batch_size", lambda v: v >= 1, ">= 1"),
        ("data.num_workers", lambda v: v >= 0, ">= 0"),
        ("model.d_model", lambda v: v >= 1, ">= 1"),
        ("model.n_heads", lambda v: v >= 1, ">= 1"),
    ]
    for key, ok, allowed in rules:
        value = OmegaConf.select(cfg, key)
        if value is None:
            raise ConfigError(f"{key}: missing; configs/task/{cfg.task}.yaml must define it")
        if not ok(value):
            raise ConfigError(f"{key}={value}: must be {allowed}")
    if cfg.run.resume not in ("", "last") and not Path(cfg.run.resume).is_file():
        raise ConfigError(f"run.resume={cfg.run.resume!r}: expected last or the path of a checkpoint file")
    _check_trainer(cfg.trainer)
    _check_compile(cfg)


def _precisions() -> list[str]:
    """The values of trainer.precision: auto, and every one lightning.Trainer accepts."""
    from lightning.fabric.connector import _PRECISION_INPUT  # (imports Lightning: see _check_trainer)

    return ["auto", *(str(value) for group in get_args(_PRECISION_INPUT) for value in get_args(group))]


def _check_trainer(trainer: DictConfig) -> None:
    """The `trainer.*` keys whose bad values Lightning would reject only once the trainer
    is built, or not at all (a test of no batch writes an empty metrics.json)."""
    for name, meaning in (("limit_val_batches", "batches per validation"),
                          ("limit_test_batches", "batches of the test")):
        value = trainer[name]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not (whole and value >= 1 or isinstance(value, float) and 0 < value <= 1):
            raise ConfigError(f"trainer.{name}={value!r}: must be an integer >= 1 ({meaning}) "
                              "or a fraction in (0, 1] of the split")
    # the default needs no list: a configuration error then reaches the command line
    # before anything imports Lightning
    precision = str(trainer.precision)
    if precision != "auto" and precision not in _precisions():
        raise ConfigError(f"trainer.precision={trainer.precision!r}: allowed: {', '.join(_precisions())}")
    max_time = trainer.max_time
    if max_time is not None and not (isinstance(max_time, str) and _DURATION.fullmatch(max_time)):
        raise ConfigError(f"trainer.max_time={max_time!r}: expected null (no limit) or a duration DD:HH:MM:SS, "
                          "e.g. 00:02:30:00 for two and a half hours")


def _check_compile(cfg: DictConfig) -> None:
    """trainer.compile: a mode of COMPILE_MODES, and one this machine can run (Inductor needs
    a C compiler on the CPU; reduce-overhead's CUDA graphs need a GPU)."""
    mode, trainer = compile_mode(cfg), cfg.trainer
    if mode not in COMPILE_MODES:
        raise ConfigError(f"trainer.compile={mode!r}: allowed {', '.join(COMPILE_MODES)}")
    on_gpu = trainer.accelerator != "cpu" and torch.cuda.is_available()
    if mode == "reduce-overhead" and not on_gpu:
        raise ConfigError("trainer.compile=reduce-overhead: captures CUDA graphs and needs a GPU; "
                          "on the CPU use default, max-autotune or off")
    if mode != "off" and not on_gpu and not (shutil.which("cc") or shutil.which("gcc")):
        raise ConfigError(f"trainer.compile={mode}: compiling on the CPU needs a C compiler (cc), "
                          "none is on PATH; set trainer.compile=off")


def check_rules(cfg: DictConfig, rules) -> None:
    """A task's range checks: (key, ok, allowed) triples; ConfigError naming the first key
    whose check fails, with its value and what is allowed."""
    for key, ok, allowed in rules:
        if not ok:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r}: must be {allowed}")
