"""`python -m lavo_tasks.train --multirun KEY=A,B ... [run.dir=SWEEP]`: run a grid of runs.

Every argument whose value holds top-level commas is a list of values (`attention=softmax,
lavo seed=0,1`: four points, in argument order, the last one varying fastest); commas inside
brackets or quotes do not split (`data.sizes=[1,2]` is one value, `'a,b'` too). Each point is
an ordinary run in its own folder under the sweep folder (run.dir; default
runs/<task>/sweep-<YYYYmmdd-HHMMSS>), named after its index and the values that vary
(`1-attention=lavo_seed=0`; a path by its file name). Every point's configuration is composed and checked before the
first one starts, so a value that does not parse fails at once, as one line naming the key.

The sweep folder holds `sweep.json` (the arguments and the points) and, at the end, the
comparison table of lavo_tasks.report (report.md, report.csv, report-*.png). A point that
fails gets `error.txt` (its error, one line; the whole output is in its sweep.log) and the
sweep goes on. The same command again skips the points whose metrics.json is complete,
continues the others from their last.ckpt (run.resume=last) and retries the failed ones.

Each point runs as a child process (`python -m lavo_tasks.train ...`): a crash, a CUDA
error or a leak in one point cannot take the sweep or the next point with it, and each
starts from a clean interpreter (seeds, Lightning's global state); the cost is the start-up
of torch, a few seconds per point. SIGINT or SIGTERM to the sweep is passed on to the running
point (which writes last.ckpt, see lavo_tasks.run.commands) and the sweep stops after it.

`--sbatch` writes `sweep.sbatch`, a SLURM job array of one task per point (each runs this
command with `--point=$SLURM_ARRAY_TASK_ID`: one point, skipped if finished, resumed if
started), instead of running anything; no other scheduler is built in.
"""

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from tqdm import tqdm

from .config import compose, read_yaml, validate
from .errors import ConfigError, Interrupted
from .files import write_atomically

SWEEP_FILE = "sweep.json"
ERROR_FILE = "error.txt"
LOG_FILE = "sweep.log"
MULTIRUN_FLAGS = ("--multirun", "-m")
_CLOSING = {"[": "]", "{": "}", "(": ")"}


@dataclass(frozen=True)
class Point:
    index: int
    name: str  # the folder's name under the sweep folder
    args: list[str]  # the train arguments of this point (without run.dir)


class SweepInterrupted(Interrupted):
    def __init__(self, signum: int, point_dir: Path, command: str = "the same command"):
        self.signum, self.run_dir = signum, point_dir
        Exception.__init__(self, f"{signal.Signals(signum).name} during {point_dir}; run {command} again to skip "
                                 "the finished points and resume the rest")


def split_values(arg: str) -> list[str]:
    """`key=a,b,[c,d]` -> ["key=a", "key=b", "key=[c,d]"]: the value split at commas
    outside brackets and quotes; ConfigError for an unclosed bracket or quote."""
    key, sep, raw = arg.partition("=")
    if not sep:
        return [arg]
    values, current, stack, quote = [], "", [], None
    for char in raw:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in _CLOSING:
            stack.append(_CLOSING[char])
        elif stack and char == stack[-1]:
            stack.pop()
        elif char == "," and not stack:
            values.append(current)
            current = ""
            continue
        current += char
    if quote or stack:
        raise ConfigError(f"argument {arg!r}: unclosed {quote or 'bracket'} in the value")
    values.append(current)
    if len(values) > 1 and any(not value.strip() for value in values):
        raise ConfigError(f"argument {arg!r}: an empty value in the list of values")
    return [f"{key}={value}" for value in values]


def _folder_name(index: int, width: int, varying: list[str]) -> str:
    """`<index>-key=value_key=value`; a path value by its last part (the index keeps names unique)."""
    parts = []
    for arg in varying:
        key, _, value = arg.partition("=")
        parts.append(f"{key}={Path(value).name if '/' in value else value}")
    text = "_".join(parts) or "run"
    safe = "".join(c if c.isalnum() or c in "._=+-" else "-" for c in text)
    return f"{index:0{width}d}-{safe}"


def expand(argv: list[str]) -> tuple[list[Point], str]:
    """The grid's points and the sweep folder (run.dir, or the default)."""
    run_dir = ""
    axes = []
    for arg in argv:
        key = arg.partition("=")[0]
        if key == "run.resume":
            raise ConfigError(f"{arg}: a sweep resumes its points itself (run the same command again)")
        values = split_values(arg)
        if key == "run.dir":
            if len(values) > 1:
                raise ConfigError(f"{arg}: run.dir names the one sweep folder; it cannot take several values")
            run_dir = arg.partition("=")[2]
            continue
        axes.append(values)
    combos = list(product(*axes))
    width = len(str(len(combos) - 1))
    points = []
    for index, combo in enumerate(combos):
        varying = [value for value, axis in zip(combo, axes) if len(axis) > 1]
        points.append(Point(index, _folder_name(index, width, varying), list(combo)))
    if not run_dir:
        tasks = {arg.partition("=")[2] for point in points for arg in point.args if arg.startswith("task=")}
        task = tasks.pop() if len(tasks) == 1 else read_yaml("train.yaml").task if not tasks else ""
        run_dir = str(Path("runs", task, f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"))
    return points, run_dir


def check_points(points: list[Point], sweep_dir: Path) -> None:
    """Compose and check every point's configuration (ConfigError naming the key)."""
    for point in points:
        cfg = compose([*point.args, f"run.dir={sweep_dir / point.name}"])
        validate(cfg)


def record_sweep(argv: list[str], points: list[Point], sweep_dir: Path) -> None:
    """sweep.json; ConfigError when the folder holds a sweep of other arguments."""
    path = sweep_dir / SWEEP_FILE
    record = {"argv": [a for a in argv if not a.startswith("run.dir=")],
              "points": [{"name": p.name, "args": p.args} for p in points]}
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old.get("argv") != record["argv"]:
            raise ConfigError(f"run.dir={str(sweep_dir)!r}: holds a sweep of other arguments "
                              f"({shlex.join(old.get('argv', []))}); choose another run.dir")
    text = json.dumps(record, indent=1) + "\n"
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: f.write(text.encode()))
    except OSError as err:
        raise ConfigError(f"run.dir={str(sweep_dir)!r}: cannot write there ({err.strerror}); "
                          "choose a folder you can write to") from None


def point_command(point: Point, point_dir: Path) -> list[str]:
    """The train command of a point: afresh, or `run.resume=last` once it has a checkpoint
    (a resumed run keeps its saved configuration, so only run.* keys are passed)."""
    base = [sys.executable, "-m", "lavo_tasks.train"]
    if (point_dir / "checkpoints" / "last.ckpt").is_file():
        return [*base, f"run.dir={point_dir}", "run.resume=last"]
    return [*base, *point.args, f"run.dir={point_dir}"]


def last_error(log_text: str) -> str:
    """The one-line error of a failed point's output: its `error: ...` line, else the
    last line (a traceback's exception)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1].removeprefix("error: ")
    return lines[-1] if lines else "no output"


class PointRunner:
    """Runs one point as a child process in its own session (so a terminal's Ctrl-C
    reaches only the sweep, which passes it on once); SIGINT / SIGTERM to the sweep are
    forwarded to the running child."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.signum: int | None = None

    def _forward(self, signum, frame) -> None:
        self.signum = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, command: list[str], log_path: Path) -> tuple[int, str]:
        """(exit code, this attempt's output); the output is appended to `log_path`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = log_path.stat().st_size if log_path.exists() else 0
        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            with open(log_path, "ab") as log:
                log.write(f"$ {shlex.join(command)}\n".encode())
                log.flush()
                self.child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                code = self.child.wait()
        finally:
            self.child = None
            for s, handler in previous.items():
                signal.signal(s, handler)
        with open(log_path, "rb") as log:
            log.seek(start)
            return code, log.read().decode("utf-8", errors="replace")


def run_point(point: Point, sweep_dir: Path, runner: PointRunner) -> tuple[bool, str]:
    """Run (or skip, or resume) one point; returns (finished, a one-line outcome). Raises
    SweepInterrupted when the sweep got a signal."""
    from .report import read_metrics  # the report's test of a finished run

    point_dir = sweep_dir / point.name
    if read_metrics(point_dir)[0] is not None:
        return True, "finished before: skipped"
    command = point_command(point, point_dir)
    resumed = "run.resume=last" in command
    started = time.perf_counter()
    code, output = runner.run(command, point_dir / LOG_FILE)
    if runner.signum is not None:
        raise SweepInterrupted(runner.signum, point_dir)
    error_path = point_dir / ERROR_FILE
    metrics, reason = read_metrics(point_dir)
    if code == 0 and metrics is not None:
        error_path.unlink(missing_ok=True)
        return True, f"{'resumed, ' if resumed else ''}done in {time.perf_counter() - started:.1f} s"
    error = last_error(output) if code != 0 else f"exit code 0 but {reason}"
    text = f"exit code {code}: {error}\n"
    write_atomically(error_path, lambda f: f.write(text.encode()))
    return False, f"FAILED ({text.strip()}); its output: {point_dir / LOG_FILE}"


def sbatch_script(argv: list[str], sweep_dir: Path, n_points: int) -> str:
    """A SLURM job array of one task per point (each one `--point=$SLURM_ARRAY_TASK_ID`)."""
    command = [sys.executable, "-m", "lavo_tasks.train", "--multirun",
               *[a for a in argv if not a.startswith("run.dir=")], f"run.dir={sweep_dir.absolute()}"]
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=lavo-sweep-{sweep_dir.name}",
        f"#SBATCH --array=0-{n_points - 1}",
        f"#SBATCH --output={sweep_dir.absolute()}/slurm-%A_%a.log",
        "#SBATCH --signal=TERM@120  # SIGTERM 2 minutes before the time limit: the point writes last.ckpt",
        "# Add your cluster's own lines here (--partition, --gres=gpu:1, --time, --cpus-per-task).",
        "# Submitting this file again runs only what is unfinished; then: python -m lavo_tasks.report "
        f"{sweep_dir.absolute()}",
        f"cd {shlex.quote(str(Path.cwd()))}",
        f"exec {shlex.join(command)} --point=$SLURM_ARRAY_TASK_ID",
        "",
    ])


def run(argv: list[str]) -> int:
    """The sweep command: `argv` without --multirun, with optional --sbatch / --point=N;
    returns the number of points that failed."""
    sbatch = "--sbatch" in argv
    only = [a for a in argv if a.startswith("--point=")]
    args = [a for a in argv if a != "--sbatch" and not a.startswith("--point=")]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown option of a sweep; options: --sbatch, --point=N")
    points, run_dir = expand(args)
    total = len(points)
    sweep_dir = Path(run_dir)
    check_points(points, sweep_dir)
    record_sweep(args, points, sweep_dir)
    if sbatch:
        path = sweep_dir / "sweep.sbatch"
        text = sbatch_script(args, sweep_dir, len(points))
        write_atomically(path, lambda f: f.write(text.encode()))
        print(f"{len(points)} points -> {path}; submit it with: sbatch {path}")
        return 0
    if only:
        index = only[-1].removeprefix("--point=")
        if not index.isdigit() or int(index) >= len(points):
            raise ConfigError(f"{only[-1]}: expected a point index in 0..{len(points) - 1}")
        points = [points[int(index)]]
    runner = PointRunner()
    failed = 0
    with tqdm(points, desc=f"sweep {sweep_dir}", unit="run") as bar:
        for point in bar:
            bar.set_postfix_str(point.name)
            try:
                finished, outcome = run_point(point, sweep_dir, runner)
            except SweepInterrupted as err:
                command = shlex.join(["python", "-m", "lavo_tasks.train", "--multirun", *argv])
                raise SweepInterrupted(err.signum, err.run_dir, command) from None
            failed += not finished
            tqdm.write(f"[{point.index + 1}/{total}] {point.name}: {outcome}")
    if not only:
        from .report import write_report

        write_report([sweep_dir], sweep_dir)
    if failed:
        print(f"{failed} of {len(points)} point(s) failed (error.txt in their folders); run the same command "
              "again to retry them", file=sys.stderr)
    return failed
