"""`python -m lavo_tasks.evaluate run.dir=<run> [ckpt=last|best|<path>]`: test a checkpoint.

Rebuilds the task from the run's config.yaml, loads the checkpoint (default `last`), runs
the test and rewrites the run's metrics.json and artifacts/.
"""

import sys

from omegaconf import OmegaConf

from .config import load_run_config, split_args, validate
from .errors import ConfigError
from .runner import evaluate, run_cli

ARGUMENTS = ("run.dir", "ckpt")


def run(args: list[str]) -> dict[str, float]:
    selectors, overrides = split_args(args)
    given = {**selectors, **dict(overrides)}
    for key in given:
        if key not in ARGUMENTS:
            raise ConfigError(f"unknown argument {key!r}; allowed: {', '.join(ARGUMENTS)}")
    run_dir = given.get("run.dir", "")
    cfg = load_run_config(run_dir, "evaluate")
    OmegaConf.set_struct(cfg, True)
    cfg.run.dir = run_dir  # the folder as given now, wherever the run was trained
    validate(cfg)
    return evaluate(cfg, given.get("ckpt", "last"))


def usage() -> str:
    return "\n".join([
        "usage: python -m lavo_tasks.evaluate run.dir=<run> [ckpt=last|best|<path>]",
        "",
        "Rebuild the run's task from its config.yaml, load the checkpoint (default last),",
        "run the test and rewrite metrics.json and artifacts/ in the run folder.",
    ])


def main(argv: list[str] | None = None) -> int:
    return run_cli(run, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
