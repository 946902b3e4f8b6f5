"""`python -m lavo_tasks.evaluate run.dir=<run> [ckpt=last|best|<path>] [key=value ...]`: test a checkpoint.

Rebuilds the task from the run's config.yaml, checks that the checkpoint (default `last`)
is one of this model, runs the test and writes the result into a new folder
`<run.dir>/eval/<ckpt>-<time>/` (metrics.json, metrics.meta.json, artifacts/); the
training run's own files are left as they are. Test-time keys may change (another test
file, fewer batches, another precision, decoding); keys that would change the model may not.
"""

import sys
from pathlib import Path

from omegaconf import OmegaConf

from .config import _set, load_run_config, split_args, validate
from .errors import ConfigError
from .runner import evaluate, run_cli

ARGUMENTS = ("run.dir", "ckpt")
# Keys that change how the test runs, not the model a checkpoint holds.
TEST_KEYS = ("data.path", "data.batch_size", "data.num_workers", "trainer.limit_test_batches",
             "trainer.precision", "trainer.accelerator", "trainer.devices", "trainer.strategy",
             "trainer.enable_progress_bar")
TEST_PREFIXES = ("decode.", "generate.")


def run(args: list[str]) -> dict[str, float]:
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
        _set(cfg, key, raw)
    if given.get("data.path"):  # absolute, as compose saves it
        cfg.data.path = str(Path(cfg.data.path).expanduser().absolute())
    validate(cfg)
    changed = {key: OmegaConf.select(cfg, key) for key in given}
    return evaluate(cfg, ckpt, changed)


def usage(argv: list[str] | None = None) -> str:
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


def main(argv: list[str] | None = None) -> int:
    return run_cli(run, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
