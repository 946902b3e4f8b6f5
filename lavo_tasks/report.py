"""`python -m lavo_tasks.report DIR... [--out DIR]`: the comparison table of runs.

Each DIR is a run folder or any folder above run folders (a sweep, runs/): every folder
below it with a config.yaml is a run (eval/ folders are not), and so is a sweep point that
failed before it wrote one (its configuration is composed from sweep.json). Runs whose
configurations differ in anything but the attention sites, the seed and the run.* keys are
never averaged together: each such group gets its own table, headed by the keys that set
it apart. Rows are attentions (one entry per site where the sites differ); columns are the
test metrics as mean ± std over seeds (sample std; "—" for one seed), the number of seeds,
wall time, peak memory and parameter count (metrics.meta.json's `resources`, see
lavo_tasks.runner). The task's model-free baselines go under the table. A run whose
metrics.json is missing or damaged is counted as failed, and listed with the reason.

Written to --out (default: DIR when one is given, else ./report): report.md, report.csv,
report.png (one panel per metric, bars with std error bars; report-<n>.png per group when
there are several) and, with runs of two or more tasks, CAB's compositional index per
pattern (lavo_tasks.compositional_index) in report.md and compositional_index.csv.
With task=mqar runs, recall.png: test accuracy against decode state size (plot_recall).
"""

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from . import tasks
from .attention import ATTENTION_NAMES
from .compositional_index import CI_METRICS, cab_dataset, compositional_index
from .config import compose
from .errors import ConfigError
from .files import write_atomically
from .plots import attention_label, save_figure

# Keys that do not make two runs different experiments: how a run writes and shows itself.
IGNORED_KEYS = ("seed", "run.", "trainer.enable_progress_bar", "trainer.log_every_n_steps")


@dataclass
class Run:
    dir: Path
    cfg: DictConfig | None
    metrics: dict[str, float] | None
    resources: dict = field(default_factory=dict)
    problem: str = ""  # why the run has no metrics ("" when it has)


def read_metrics(run_dir: Path) -> tuple[dict[str, float] | None, str]:
    """(metrics.json as {name: number}, "") for a finished run; (None, reason) when
    metrics.json or metrics.meta.json is missing or damaged."""
    values = {}
    for name in ("metrics.json", "metrics.meta.json"):
        path = run_dir / name
        if not path.is_file():
            return None, f"{name} missing"
        try:
            values[name] = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            return None, f"{name} damaged ({type(err).__name__})"
    metrics = values["metrics.json"]
    if not isinstance(metrics, dict) or not metrics or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()):
        return None, "metrics.json damaged (not a non-empty {name: number})"
    return {k: float(v) for k, v in metrics.items()}, ""


def find_runs(dirs: Sequence[str]) -> list[Run]:
    """The runs in or below `dirs`; ConfigError for a missing folder or when none holds a run."""
    found: dict[Path, None] = {}
    for name in dirs:
        root = Path(name)
        if not root.is_dir():
            raise ConfigError(f"{name}: no such folder")
        marks = [root / "config.yaml"] if (root / "config.yaml").is_file() else sorted(
            [*root.rglob("config.yaml"), *root.rglob("error.txt")])
        for mark in marks:
            if "eval" not in mark.parent.relative_to(root).parts:
                found[mark.parent] = None
    if not found:
        raise ConfigError(f"no run (a folder with config.yaml) in: {', '.join(dirs)}")
    return [load_run(path) for path in found]


def _point_config(run_dir: Path) -> DictConfig | None:
    """The configuration of a sweep point that stopped before writing config.yaml."""
    sweep = run_dir.parent / "sweep.json"
    if not sweep.is_file():
        return None
    points = {p["name"]: p["args"] for p in json.loads(sweep.read_text(encoding="utf-8"))["points"]}
    return compose([*points[run_dir.name], f"run.dir={run_dir}"]) if run_dir.name in points else None


def load_run(run_dir: Path) -> Run:
    error = (run_dir / "error.txt").read_text(encoding="utf-8").strip() if (run_dir / "error.txt").is_file() else ""
    try:
        cfg = OmegaConf.load(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else _point_config(run_dir)
    except Exception as err:  # a damaged YAML file: listed as such
        return Run(run_dir, None, None, problem=f"config.yaml unreadable ({type(err).__name__}) {error}".strip())
    if cfg is None:
        return Run(run_dir, None, None, problem=f"no config.yaml {error}".strip())
    metrics, problem = read_metrics(run_dir)
    if metrics is None:
        return Run(run_dir, cfg, None, problem=f"{problem}; {error}" if error else problem)
    meta = json.loads((run_dir / "metrics.meta.json").read_text(encoding="utf-8"))
    resources = meta.get("resources", {}) if isinstance(meta, dict) else {}
    return Run(run_dir, cfg, metrics, resources)


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out |= _flat(inner, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): value}


def experiment_keys(cfg: DictConfig) -> dict:
    """The flat configuration without what a comparison varies (the attention sites, the
    seed) and what does not change results (IGNORED_KEYS)."""
    sites = tasks.load_task(cfg.task).sites
    flat = _flat(OmegaConf.to_container(cfg, resolve=True))
    site_keys = tuple(f"model.{site}." for site in sites)
    return {k: v for k, v in flat.items() if not k.startswith(site_keys) and not k.startswith(IGNORED_KEYS)
            and k not in (f"model.{s}" for s in sites)}


@dataclass
class Group:
    task: str
    keys: dict
    runs: list[Run] = field(default_factory=list)
    title: str = ""

    def rows(self) -> dict[str, list[Run]]:
        """{attention label: runs}, in the order the runs were found."""
        rows: dict[str, list[Run]] = {}
        for run in self.runs:
            rows.setdefault(attention_label(run.cfg), []).append(run)
        return rows


def group_runs(runs: list[Run]) -> list[Group]:
    groups: dict[str, Group] = {}
    for run in runs:
        if run.cfg is None:
            continue
        keys = experiment_keys(run.cfg)
        group = groups.setdefault(json.dumps(keys, sort_keys=True, default=str), Group(run.cfg.task, keys))
        group.runs.append(run)
    result = list(groups.values())
    for group in result:
        others = [g for g in result if g.task == group.task and g is not group]
        differ = sorted({k for g in others for k in set(g.keys) | set(group.keys) if g.keys.get(k) != group.keys.get(k)})
        preset = group.keys.get("model.preset")
        parts = [f"task {group.task}"] + ([f"model.preset={preset}"] if preset is not None else [])
        parts += [f"{k}={group.keys.get(k)}" for k in differ if k != "model.preset"]
        group.title = ", ".join(parts)
    return result


def mean_std(values: list[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean, std = mean_std(values)
    return f"{mean:.4g} ± {std:.2g}" if std is not None else f"{mean:.4g}"


@dataclass
class Table:
    group: Group
    metrics: list[str]  # the model's test metrics (columns)
    baselines: list[str]  # the task's model-free metrics present
    rows: dict[str, list[Run]]

    def values(self, row: str, name: str) -> list[float]:
        return [run.metrics[name] for run in self.rows[row] if run.metrics and name in run.metrics]

    def resource(self, row: str, name: str) -> list[float]:
        return [run.resources[name] for run in self.rows[row] if run.metrics and name in run.resources]


def build_table(group: Group) -> Table:
    baselines = set(tasks.load_task(group.task).baselines)
    names = list(dict.fromkeys(name for run in group.runs if run.metrics for name in run.metrics))
    return Table(group, [n for n in names if n not in baselines], [n for n in names if n in baselines], group.rows())


def markdown(table: Table) -> str:
    memory_kinds = {run.resources.get("memory") for runs in table.rows.values() for run in runs if run.resources}
    memory = "peak memory MiB" + (f" ({', '.join(sorted(k for k in memory_kinds if k))})" if memory_kinds else "")
    header = ["attention", *table.metrics, "n seeds", "failed", "wall s", memory, "parameters"]
    lines = [f"### {table.group.title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    failed = []
    for row, runs in table.rows.items():
        ok = [run for run in runs if run.metrics]
        failed += [run for run in runs if not run.metrics]
        mem = [m / 2**20 for m in table.resource(row, "peak_memory_bytes")]
        params = sorted({int(p) for p in table.resource(row, "parameters")})
        cells = [row, *(_cell(table.values(row, m)) for m in table.metrics), str(len(ok)), str(len(runs) - len(ok)),
                 _cell(table.resource(row, "wall_s")), _cell(mem),
                 ", ".join(f"{p:,}" for p in params) if params else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if table.baselines:
        runs = [run for runs in table.rows.values() for run in runs if run.metrics]
        figures = ", ".join(f"{name} {_cell([r.metrics[name] for r in runs if name in r.metrics])}"
                            for name in table.baselines)
        lines += [f"Model-free baselines (the same data for every attention): {figures}", ""]
    resumed = sum(1 for runs in table.rows.values() for run in runs if run.resources.get("resumed"))
    if resumed:
        lines += [f"Wall time of {resumed} resumed run(s) counts only their last session.", ""]
    if failed:
        lines += ["Failed runs:", *(f"- {run.dir}: {run.problem}" for run in failed), ""]
    return "\n".join(lines)


def plot(table: Table, path: Path) -> None:
    """One panel per metric: a bar per attention, error bar = std over seeds."""
    names = table.metrics
    fig = Figure(figsize=(min(4 * len(names), 16), 3.6 + 0.4 * math.ceil(len(names) / 4) * 3))
    columns = min(len(names), 4)
    axes = fig.subplots(math.ceil(len(names) / columns), columns, squeeze=False).ravel()
    rows = list(table.rows)
    for ax, name in zip(axes, names):
        stats = [mean_std(table.values(row, name)) if table.values(row, name) else (math.nan, None) for row in rows]
        ax.bar(range(len(rows)), [m for m, _ in stats], yerr=[s or 0 for _, s in stats], capsize=4,
               color="tab:blue", alpha=0.8)
        ax.set_xticks(range(len(rows)), [row.split("(")[0] if len(rows) > 1 else row for row in rows],
                      rotation=30, ha="right", fontsize=8)
        ax.set_title(name, fontsize=9)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(f"{table.group.title} (error bars: std over seeds)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def csv_text(tables: list[Table]) -> str:
    metrics = list(dict.fromkeys(m for t in tables for m in [*t.metrics, *t.baselines]))
    header = ["group", "task", "attention", "n_seeds", "failed", *(f"{m}_{s}" for m in metrics for s in ("mean", "std")),
              "wall_s_mean", "wall_s_std", "peak_memory_mib_mean", "memory", "parameters"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for table in tables:
        for row, runs in table.rows.items():
            def stats(values):
                if not values:
                    return ["", ""]
                mean, std = mean_std(values)
                return [f"{mean:.10g}", "" if std is None else f"{std:.10g}"]

            ok = [run for run in runs if run.metrics]
            kinds = sorted({r.resources.get("memory", "") for r in ok} - {""})
            writer.writerow([table.group.title, table.group.task, row, len(ok), len(runs) - len(ok),
                             *(x for m in metrics for x in stats(table.values(row, m))),
                             *stats(table.resource(row, "wall_s")),
                             stats([m / 2**20 for m in table.resource(row, "peak_memory_bytes")])[0],
                             ",".join(kinds), ",".join(str(int(p)) for p in sorted(set(table.resource(row, "parameters"))))])
    return out.getvalue()


def index_inputs(groups: list[Group]) -> tuple[dict, dict, list[str]]:
    """results[pattern][task][attention name] = {metric: mean over seeds} and the CAB key of
    each task, for lavo_tasks.compositional_index; tasks with more than one group are left out."""
    results, cab_keys, notes = {}, {}, []
    by_task: dict[str, list[Group]] = {}
    for group in groups:
        by_task.setdefault(group.task, []).append(group)
    for task, task_groups in by_task.items():
        if len(task_groups) > 1:
            notes.append(f"task {task} left out: its runs form {len(task_groups)} configurations "
                         f"({'; '.join(g.title for g in task_groups)}), the index takes one per task")
            continue
        runs = [run for run in task_groups[0].runs if run.metrics]
        keys = {cab_dataset(task, OmegaConf.select(r.cfg, "model.preset"), r.cfg.data.path) for r in runs}
        cab_keys[task] = keys.pop() if len(keys) == 1 else None
        sites = tasks.load_task(task).sites
        for pattern in dict.fromkeys(sites.values()):
            collected: dict[str, list[dict]] = {}
            for run in runs:
                names = {run.cfg.model[s].name for s, p in sites.items() if p == pattern}
                if len(names) == 1:
                    collected.setdefault(names.pop(), []).append(run.metrics)
            means = {a: {m: sum(r[m] for r in rs) / len(rs) for m in CI_METRICS.get(task, {}) if all(m in r for r in rs)}
                     for a, rs in collected.items()}
            results.setdefault(pattern, {})[task] = means
    return results, cab_keys, notes


def index_markdown(groups: list[Group]) -> tuple[str, str]:
    """The compositional index section of report.md and compositional_index.csv."""
    results, cab_keys, notes = index_inputs(groups)
    index, source, more = compositional_index(results, cab_keys)
    patterns = [p for p in ("NS", "CS", "NC", "CC") if index.get(p)]
    attentions = list(dict.fromkeys(a for p in patterns for a in index[p]))
    lines = ["## CAB's compositional index per pattern", "",
             "Per metric z = ±(x − mu)/sigma (+ where higher is better), averaged within a task, then over "
             "the tasks of the pattern (cell: index (tasks)).", "",
             "| attention | " + " | ".join(patterns) + " |", "|---|" + "---|" * len(patterns)]
    rows = [["pattern", "attention", "index", "n_tasks", "mu_sigma"]]
    for attention in attentions:
        cells = [f"{index[p][attention][0]:+.3f} ({index[p][attention][1]})" if attention in index[p] else "—"
                 for p in patterns]
        lines.append(f"| {attention} | " + " | ".join(cells) + " |")
        rows += [[p, attention, f"{index[p][attention][0]:.10g}", index[p][attention][1], source[p]]
                 for p in patterns if attention in index[p]]
    lines.append("")
    for p in patterns:
        where = ("CAB's published mu/sigma (Shark-NLP/CAB scripts/compositional_index)" if source[p] == "CAB"
                 else "mu/sigma over the attentions in this report (not CAB's: the runs are not CAB's configuration)")
        lines.append(f"- {p}: tasks {', '.join(results[p])}; {where}")
    lines += [*(f"- {note}" for note in [*notes, *more]), ""]
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return "\n".join(lines), out.getvalue()


def plot_recall(runs: list[Run], path: Path) -> bool:
    """task=mqar's recall against memory: test_acc (mean over seeds) against
    test_state_size (numbers per sequence and layer, log scale), one line per attention
    and one panel per data.variant, over every finished mqar run whatever its other keys
    (a sweep over window, rank, slots and width). False when there is no such run."""
    points: dict[str, dict[str, dict[float, list[float]]]] = {}  # variant -> attention -> size -> accuracies
    for run in runs:
        if run.cfg is None or run.cfg.task != "mqar" or not run.metrics or "test_state_size" not in run.metrics:
            continue
        by_size = points.setdefault(run.cfg.data.variant, {}).setdefault(run.cfg.model.attention.name, {})
        by_size.setdefault(run.metrics["test_state_size"], []).append(run.metrics["test_acc"])
    if not points:
        return False
    fig = Figure(figsize=(5 * len(points), 4))
    for ax, (variant, lines) in zip(fig.subplots(1, len(points), squeeze=False)[0], sorted(points.items())):
        for name, by_size in sorted(lines.items()):
            sizes = sorted(by_size)
            color = f"C{sorted(ATTENTION_NAMES).index(name)}" if name in ATTENTION_NAMES else None  # one per attention
            ax.plot(sizes, [sum(by_size[s]) / len(by_size[s]) for s in sizes], marker="o", label=name, color=color)
        ax.set(xscale="log", xlabel="decode state per sequence and layer (numbers)", ylabel="test accuracy",
               ylim=(-0.02, 1.02), title=f"MQAR recall, variant {variant}")
        ax.minorticks_off()
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    return True


def write_report(dirs: Sequence, out: Path) -> str:
    """Build the report of the runs in `dirs` into `out`; returns the Markdown."""
    runs = find_runs([str(d) for d in dirs])
    groups = group_runs(runs)
    tables = [build_table(g) for g in groups]
    unreadable = [run for run in runs if run.cfg is None]
    n_tasks = len({g.task for g in groups})
    parts = [f"# Comparison of {len(runs)} run(s) in {', '.join(str(d) for d in dirs)}", "",
             f"{len(groups)} configuration group(s): runs that differ in anything but the attention and the seed "
             "are in separate tables, never averaged together.", ""]
    out.mkdir(parents=True, exist_ok=True)
    for n, table in enumerate(tables):
        png = "report.png" if len(tables) == 1 else f"report-{n + 1}.png"
        if table.metrics:
            plot(table, out / png)
        parts += [markdown(table), f"![{table.group.title}]({png})" if table.metrics else "(no finished run to plot)", ""]
    if unreadable:
        parts += ["Runs without a readable configuration (failed):", *(f"- {r.dir}: {r.problem}" for r in unreadable), ""]
    if plot_recall(runs, out / "recall.png"):
        parts += ["MQAR: test accuracy against decode state size, one line per attention.", "",
                  "![recall against state size](recall.png)", ""]
    if n_tasks >= 2:
        text, index_csv = index_markdown(groups)
        parts.append(text)
        write_atomically(out / "compositional_index.csv", lambda f: f.write(index_csv.encode()))
    text = "\n".join(parts)
    write_atomically(out / "report.md", lambda f: f.write(text.encode()))
    table_csv = csv_text(tables)
    write_atomically(out / "report.csv", lambda f: f.write(table_csv.encode()))
    print(text)
    print(f"report -> {out / 'report.md'}, {out / 'report.csv'}", file=sys.stderr)
    return text


def usage(argv=None) -> str:
    return "usage: python -m lavo_tasks.report DIR... [--out DIR]\n\n" + __doc__.split("\n\n", 1)[1]


def run(argv: list[str]) -> None:
    out, dirs, args = None, [], iter(argv)
    for arg in args:
        if arg == "--out":
            out = next(args, None)
            if out is None:
                raise ConfigError("--out: expected a folder after it")
        elif arg.startswith("--out="):
            out = arg.removeprefix("--out=")
        elif arg.startswith("-"):
            raise ConfigError(f"{arg}: unknown option; usage: python -m lavo_tasks.report DIR... [--out DIR]")
        else:
            dirs.append(arg)
    if not dirs:
        raise ConfigError("no folder given; usage: python -m lavo_tasks.report DIR... [--out DIR]")
    write_report(dirs, Path(out) if out else Path(dirs[0]) if len(dirs) == 1 else Path("report"))


def main(argv: list[str] | None = None) -> int:
    from .runner import run_cli

    return run_cli(run, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
