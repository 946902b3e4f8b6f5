"""`python -m lavo_tasks.train [task=NAME] [attention=NAME] [key=value ...]`: train, then test.

In Python: `lavo_tasks.train.run(["task=lm", "trainer.max_steps=50"])` returns the test
metrics (and raises ConfigError for bad arguments); `main(argv)` is the command itself.
"""

import sys

from omegaconf import DictConfig

from . import tasks
from .attention import ATTENTION_NAMES
from .config import DEFAULT_ATTENTION, compose, read_yaml, validate
from .runner import run_cli, train


def run(args: list[str]) -> dict[str, float]:
    cfg = compose(args)
    validate(cfg)
    return train(cfg)


def _key_lines(cfg: DictConfig, prefix: str = "") -> list[str]:
    lines = []
    for key, value in cfg.items():
        if isinstance(value, DictConfig):
            lines.extend(_key_lines(value, f"{prefix}{key}."))
        else:
            lines.append(f"  {prefix}{key}={value}")
    return lines


def usage() -> str:
    attention_keys = []
    for name in ATTENTION_NAMES:
        group = read_yaml(f"attention/{name}.yaml").attention
        keys = [f"attention.{key}={value}" for key, value in group.items() if key != "name"]
        attention_keys.append(f"  {name}: {' '.join(keys) or '(no keys)'}")
    return "\n".join([
        "usage: python -m lavo_tasks.train [task=NAME] [attention=NAME] [key=value ...]",
        "",
        "Train a model on a task, then test it. The run writes config.yaml, checkpoints/,",
        "metrics.jsonl, metrics.json and artifacts/ into run.dir.",
        "",
        "tasks (task=NAME; each adds data.* and model.* keys from configs/task/NAME.yaml) and their",
        "attention sites (model.SITE=NAME for one site, model.SITE.KEY=VALUE for one of its keys):",
        *(f"  {name}: {', '.join(f'model.{site} ({pattern})' for site, pattern in tasks.load_task(name).sites.items())}"
          for name in tasks.task_names()),
        f"attentions (attention=NAME for every site, default {DEFAULT_ATTENTION}; attention.KEY=VALUE at its sites):",
        *attention_keys,
        "",
        "keys every task shares (defaults from configs/train.yaml):",
        *_key_lines(read_yaml("train.yaml")),
        "",
        "examples:",
        "  python -m lavo_tasks.train task=lm attention=gsa attention.slots=32 trainer.max_steps=100",
        "  python -m lavo_tasks.train task=tsf model.cross_attention=lavo model.cross_attention.window=64",
        "  python -m lavo_tasks.train run.dir=runs/lm/my-run run.resume=last",
        "",
        "run.resume=last continues a stopped run from checkpoints/last.ckpt exactly as if it had",
        "not stopped; with a larger trainer.max_steps it extends a run (the learning-rate",
        "schedule then follows the new length).",
    ])


def main(argv: list[str] | None = None) -> int:
    return run_cli(run, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
