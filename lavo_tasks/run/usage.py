"""The help texts of the commands (`-h` / `--help`): train's, from the composed
configuration and the YAML files' comments, and evaluate's."""

from omegaconf import DictConfig

from .. import tasks
from ..attention import ATTENTION_NAMES
from ..attention.base import PATTERN_NAMES
from ..config import DEFAULT_ATTENTION, TEST_KEYS, TEST_PREFIXES, attention_defaults, compose, read_yaml, split_args
from ..keydoc import key_comments


def _leaves(cfg: DictConfig, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf key of `cfg`, in file order."""
    leaves = []
    for key, value in cfg.items():
        if isinstance(value, DictConfig):
            leaves.extend(_leaves(value, f"{prefix}{key}."))
        else:
            leaves.append((f"{prefix}{key}", value))
    return leaves


def _key_lines(leaves: list[tuple[str, object]], comments: dict[str, str]) -> list[str]:
    """`  key=default   meaning` (meaning: the key's YAML comment, each further line of it
    below the first, under it)."""
    lines = []
    for path, value in leaves:
        text = f"{path}={value!r}" if value == "" else f"{path}={value}"
        first, *more = comments.get(path, "").split("\n")
        prefix = f"  {text:<34} "
        lines.append(prefix + first if first else f"  {text}")
        lines += [" " * len(prefix) + line for line in more]
    return lines


def _causal_switch(task, site: str, pattern: str) -> str:
    """`; model.cross_causal=true: CC (...)` for a site whose causality a key chooses."""
    key = task.causal_keys.get(site)
    if key is None:
        return ""
    other = ("N" if pattern[0] == "C" else "C") + pattern[1]
    return f"; {key}={str(pattern[0] == 'N').lower()}: {other} ({PATTERN_NAMES[other]})"


def _task_of(argv: list[str]) -> str:
    selectors, _ = split_args([arg for arg in argv if "=" in arg])
    return selectors.get("task") or read_yaml("train.yaml").task


def train_usage(argv: list[str] | None = None) -> str:
    """The help text; with `task=NAME` among `argv`, that task's keys and defaults."""
    task = _task_of(argv or [])
    cfg = compose([f"task={task}"])
    task_yaml = read_yaml(f"task/{task}.yaml")
    task_yaml.pop("presets", None)
    own_keys = {path for path, _ in _leaves(task_yaml)}
    task_of_cfg = tasks.load_task(task)
    sites = task_of_cfg.site_patterns(cfg)
    site_keys = tuple(f"model.{site}." for site in sites)  # each site's whole attention config
    leaves = [(path, value) for path, value in _leaves(cfg)
              if not path.startswith("attention.") and not path.startswith(site_keys)]
    comments = {**key_comments("train.yaml"), **key_comments(f"task/{task}.yaml")}
    attention_lines = []
    for name in ATTENTION_NAMES:
        group = attention_defaults(name)
        keys = _key_lines([(f"attention.{k}", v) for k, v in group.items() if k != "name"],
                          key_comments(f"attention/{name}.yaml"))
        attention_lines += [f"  {name}:" + ("" if keys else " (no keys)"), *("  " + line for line in keys)]
    site_lines = [f"  model.{site}: {pattern} ({PATTERN_NAMES[pattern]})" + _causal_switch(task_of_cfg, site, pattern)
                  for site, pattern in sites.items()]
    return "\n".join([
        "usage: python -m lavo_tasks.train [task=NAME] [attention=NAME] [key=value ...]",
        "",
        "Train a model on a task, then test it. The run writes config.yaml, checkpoints/,",
        "metrics.jsonl, metrics.json, logs/ and artifacts/ into run.dir.",
        "",
        f"tasks (task=NAME; add task=NAME to --help for its keys): {', '.join(tasks.task_names())}",
        "",
        f"task {task}: keys of configs/task/{task}.yaml (defaults):",
        *_key_lines([leaf for leaf in leaves if leaf[0] in own_keys], comments),
        "",
        f"attention sites of {task} (attention=NAME sets every site, model.SITE=NAME one site, "
        "model.SITE.KEY=VALUE one key of it):",
        *site_lines,
        "",
        f"attentions (attention=NAME, default {DEFAULT_ATTENTION}):",
        *attention_lines,
        "",
        "keys every task shares (configs/train.yaml, with this task's defaults):",
        *_key_lines([leaf for leaf in leaves if leaf[0] not in own_keys], comments),
        "",
        "examples:",
        "  python -m lavo_tasks.train task=lm attention=gsa attention.slots=32 trainer.max_steps=100",
        "  python -m lavo_tasks.train task=tsf model.cross_attention=lavo model.cross_attention.window=64",
        "  python -m lavo_tasks.train run.dir=runs/lm/my-run run.resume=last",
        "  python -m lavo_tasks.train --multirun task=tsf attention=softmax,lavo,gsa seed=0,1",
        "",
        "--multirun (-m): every comma list of values (outside brackets and quotes) is an axis of a",
        "grid; one run per point under the sweep folder run.dir (default runs/<task>/sweep-<time>),",
        "then the comparison table (python -m lavo_tasks.report). Started again, it skips the",
        "finished points and resumes the rest. --sbatch writes a SLURM job array instead.",
        "",
        "run.resume=last continues a stopped run from checkpoints/last.ckpt exactly as if it had",
        "not stopped; with a larger trainer.max_steps it extends a run (the learning-rate",
        "schedule then follows the new length). Ctrl-C or SIGTERM writes last.ckpt first.",
    ])


def evaluate_usage(argv: list[str] | None = None) -> str:
    return "\n".join([
        "usage: python -m lavo_tasks.evaluate run.dir=<run> [ckpt=last|best|<path>] [key=value ...]",
        "",
        "Rebuild the run's task from its config.yaml, load the checkpoint (default last), run",
        "the test and write metrics.json, metrics.meta.json and artifacts/ into a new folder",
        "<run.dir>/eval/<ckpt>-<time>/.",
        "",
        "test-time keys it may change: " + ", ".join([*TEST_KEYS, *(p + "*" for p in TEST_PREFIXES)]),
        "  e.g. data.path=<another test file> trainer.limit_test_batches=10 trainer.precision=bf16-mixed",
    ])
