"""The command line: `python -m lavo_tasks.train` and `python -m lavo_tasks.evaluate`
(thin entry modules over this one), and `run_cli`, which turns a command's errors into
one line on stderr and an exit code, for these and the other commands (report, bench).

Exit codes: 0 done; 1 some sweep points failed, or training diverged; 2 bad input
(ConfigError: the message names the key or file); 128 + the signal's number when a
signal stopped the command (last.ckpt written when it came during a training step), or
stdout was closed early (SIGPIPE's number).
"""

import os
import signal
import sys
from collections.abc import Callable

from ..config import compose, compose_evaluation, validate
from ..errors import ConfigError, Diverged, Interrupted
from ..sweep import MULTIRUN_FLAGS
from ..sweep import run as run_sweep
from .usage import evaluate_usage, train_usage


def run_train(args: list[str]) -> dict[str, float]:
    """`train`'s body: compose and check the configuration, train, test; the test metrics."""
    cfg = compose(args)
    validate(cfg)
    from .commands import train  # imports Lightning, which a configuration error does not need

    return train(cfg)


def run_evaluate(args: list[str]) -> dict[str, float]:
    """`evaluate`'s body: the run's configuration with the test-time keys changed,
    checked, then the test of the checkpoint; the test metrics."""
    cfg, ckpt, changed = compose_evaluation(args)
    validate(cfg)
    from .commands import evaluate  # (as run_train)

    return evaluate(cfg, ckpt, changed)


def train_main(argv: list[str] | None = None) -> int:
    """The train command (with --multirun / -m, a sweep, lavo_tasks.sweep); its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if any(flag in argv for flag in MULTIRUN_FLAGS):
        failed = []
        code = run_cli(lambda args: failed.append(run_sweep(args)), [a for a in argv if a not in MULTIRUN_FLAGS],
                       train_usage)
        return 1 if code == 0 and failed and failed[0] else code  # 1: some points failed
    return run_cli(run_train, argv, train_usage)


def evaluate_main(argv: list[str] | None = None) -> int:
    """The evaluate command; its exit code."""
    return run_cli(run_evaluate, sys.argv[1:] if argv is None else argv, evaluate_usage)


def run_cli(body: Callable[[list[str]], object], argv: list[str], usage: Callable[[list[str]], str]) -> int:
    """Run `body(argv)` as a command: `-h`/`--help` prints `usage(argv)`; a ConfigError
    (bad input) prints `error: <message>` as one line on stderr, no traceback, exit code
    2; Interrupted (a signal, last.ckpt written) and Ctrl-C outside training steps print
    one line too, exit code 128 + the signal's number; Diverged (non-finite
    gradients) prints one line, exit code 1."""
    try:
        if "-h" in argv or "--help" in argv:
            print(usage([arg for arg in argv if arg not in ("-h", "--help")]))
            return 0
        body(argv)
    except ConfigError as err:
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 128 + err.signum
    except Diverged as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped: SIGINT outside a training step, so no checkpoint was written now", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # the reader of stdout went away (`--help | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush is quiet too
        return 128 + signal.SIGPIPE
    return 0
