"""`python -m lavo_tasks.report DIR... [--out DIR]`: the comparison table of runs.

Each DIR is a run folder or any folder above run folders (a sweep, runs/): every folder
below it with a config.yaml is a run (eval/ folders are not), and so is a sweep point that
failed before it wrote one (its configuration is composed from sweep.json). Runs whose
configurations differ in anything but the attention sites, the seed and the run.* keys are
never averaged together: each such group gets its own table, headed by the keys that set
it apart. Rows are attentions (one entry per site where the sites differ); columns are the
model's headline test metrics, marked ↓ (lower is better) or ↑, as mean ± std over seeds
(sample std; "—" for one seed), the number of seeds, wall time, peak memory and parameter
count (metrics.meta.json's `resources`, see lavo_tasks.run.commands). A metric
`<metric>_<part>` (pcc's per category, lm's per test length) is a breakdown: it gets a
table of its own. The task's model-free baselines (`Task.baselines`, and their
breakdowns) go in a table under it, a row per baseline in the columns of the metric each
compares with. A run whose metrics.json is missing or damaged is counted as failed, and
listed with the reason.

Written to --out (default: DIR when one is given, else ./report): report.md, report.csv
(every metric, breakdowns and baselines included), report.png (one panel per headline
metric: a point per attention with std error bars, the baselines as dashed lines, the
y axis spanning the data rather than starting at 0; report-<n>.png per group when there
are several) and, with runs of two or more tasks, CAB's compositional index per
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
from matplotlib.ticker import FuncFormatter
from omegaconf import DictConfig, OmegaConf

from . import tasks
from .attention import ATTENTION_NAMES
from .compositional_index import CI_METRICS, cab_dataset, compositional_index
from .config import compose
from .errors import ConfigError
from .files import write_atomically
from .plots import attention_label, readable_ylim, save_figure, set_suptitle

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


# What a better value of a metric is, by the end of its name (`test_decode_acc` ends in
# `acc`); a breakdown `<metric>_<part>` goes the way of its metric. Other metrics (a length
# ratio, a mean length) have no better direction and get no mark.
LOWER_IS_BETTER = ("loss", "ppl", "mse", "mae", "mase", "smape", "nd", "cd_l1", "cd_l2", "mcd", "msd")
HIGHER_IS_BETTER = ("fscore", "rouge1", "rouge2", "rougeL", "acc", "accuracy")
MARKS = {"lower": "↓", "higher": "↑", "": ""}


def better(name: str) -> str:
    """"lower", "higher" or "" (no direction, or a metric this table does not know)."""
    for ends, word in ((LOWER_IS_BETTER, "lower"), (HIGHER_IS_BETTER, "higher")):
        if any(name == end or name.endswith("_" + end) for end in ends):
            return word
    return ""


def marked(name: str) -> str:
    """`test_mse ↓`: the name with its better direction."""
    return f"{name} {MARKS[better(name)]}".rstrip()


def split_parts(names: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(headline metrics, {headline: its breakdowns}): a name `<headline>_<part>` whose
    headline is among `names` is a breakdown of it (pcc's `test_cd_l1_<category>`, lm's
    `test_ppl_2x`), filed under the longest such headline."""
    heads = [n for n in names if not any(n.startswith(h + "_") for h in names if h != n)]
    parts: dict[str, list[str]] = {}
    for name in names:
        if name not in heads:
            head = max((h for h in heads if name.startswith(h + "_")), key=len)
            parts.setdefault(head, []).append(name)
    return heads, parts


def baseline_label(baseline: str, metric: str) -> str | None:
    """What `baseline` is beside `metric`: `last_value` for test_last_value_mse beside
    test_mse (a baseline name is `test_<what>_<the metric's name after test_>`), else None."""
    tail = "_" + metric.removeprefix("test_")
    if not baseline.endswith(tail) or baseline == metric:
        return None
    return baseline.removeprefix("test_").removesuffix(tail) or None


@dataclass
class Table:
    group: Group
    metrics: list[str]  # the model's headline test metrics: the table's columns, the plot's panels
    parts: dict[str, list[str]]  # {headline metric: its breakdowns}, tables of their own
    baselines: list[str]  # the task's model-free metrics present, breakdowns included
    rows: dict[str, list[Run]]

    def values(self, row: str, name: str) -> list[float]:
        return [run.metrics[name] for run in self.rows[row] if run.metrics and name in run.metrics]

    def resource(self, row: str, name: str) -> list[float]:
        return [run.resources[name] for run in self.rows[row] if run.metrics and name in run.resources]

    def baseline_values(self, name: str) -> list[float]:
        """A baseline's figure in every finished run (the same data, so the same up to the seed's split)."""
        return [run.metrics[name] for runs in self.rows.values() for run in runs if run.metrics and name in run.metrics]

    def baseline_cell(self, name: str) -> str:
        """The baseline's figure; mean ± std only where its runs differ (seeds that split the data apart)."""
        values = self.baseline_values(name)
        if values and max(values) - min(values) <= 1e-9 * max(abs(v) for v in values):
            return f"{values[0]:.4g}"
        return _cell(values)

    def baselines_of(self, metric: str) -> dict[str, str]:
        """{label: baseline metric} of the baselines that compare with `metric`."""
        labels = {b: baseline_label(b, metric) for b in self.baselines}
        return {label: b for b, label in labels.items() if label}

    def all_metrics(self) -> list[str]:
        """Every metric of the table, each headline followed by its breakdowns."""
        return [*(n for m in self.metrics for n in (m, *self.parts.get(m, ()))), *self.baselines]


def build_table(group: Group) -> Table:
    declared = tasks.load_task(group.task).baselines
    names = list(dict.fromkeys(name for run in group.runs if run.metrics for name in run.metrics))
    baselines = [n for n in names if any(n == b or n.startswith(b + "_") for b in declared)]
    metrics, parts = split_parts([n for n in names if n not in baselines])
    return Table(group, metrics, parts, baselines, group.rows())


def markdown(table: Table) -> str:
    memory_kinds = {run.resources.get("memory") for runs in table.rows.values() for run in runs if run.resources}
    memory = "peak memory MiB" + (f" ({', '.join(sorted(k for k in memory_kinds if k))})" if memory_kinds else "")
    header = ["attention", *map(marked, table.metrics), "n seeds", "failed", "wall s", memory, "parameters"]
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
    lines += ["", "↓ lower is better, ↑ higher is better; mean ± std over seeds.", ""]
    lines += _baseline_lines(table)
    for metric, parts in table.parts.items():
        lines += _parts_lines(table, metric, parts)
    resumed = sum(1 for runs in table.rows.values() for run in runs if run.resources.get("resumed"))
    if resumed:
        lines += [f"Wall time of {resumed} resumed run(s) counts only their last session.", ""]
    if failed:
        lines += ["Failed runs:", *(f"- {run.dir}: {run.problem}" for run in failed), ""]
    return "\n".join(lines)


def _baseline_lines(table: Table) -> list[str]:
    """The model-free baselines as a table of their own: a row per baseline, in the columns
    of the metrics they compare with; baselines beside no metric of the table as a line."""
    columns = [m for m in table.metrics if table.baselines_of(m)]
    labels = list(dict.fromkeys(label for m in columns for label in table.baselines_of(m)))
    shown = {table.baselines_of(m)[label] for m in columns for label in table.baselines_of(m)}
    lines = []
    if labels:
        lines += ["Model-free baselines (the same data for every attention):", "",
                  "| baseline | " + " | ".join(map(marked, columns)) + " |", "|---|" + "---|" * len(columns)]
        for label in labels:
            cells = [table.baseline_cell(table.baselines_of(m)[label]) if label in table.baselines_of(m) else "—"
                     for m in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    in_parts = {b for parts in table.parts.values() for part in parts for b in table.baselines_of(part).values()}
    others = [b for b in table.baselines if b not in shown and b not in in_parts]
    if others:
        figures = ", ".join(f"{name} {table.baseline_cell(name)}" for name in others)
        lines += [f"Other model-free figures: {figures}", ""]
    return lines


def _parts_lines(table: Table, metric: str, parts: list[str]) -> list[str]:
    """The breakdowns of `metric` (`<metric>_<part>`): a column per part, a row per
    attention, then a row per baseline."""
    names = [part.removeprefix(metric + "_") for part in parts]
    lines = [f"{marked(metric)} by part ({metric}_<part>):", "",
             "| attention | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for row in table.rows:
        lines.append(f"| {row} | " + " | ".join(_cell(table.values(row, part)) for part in parts) + " |")
    labels = list(dict.fromkeys(label for part in parts for label in table.baselines_of(part)))
    for label in labels:
        cells = [table.baseline_cell(table.baselines_of(part)[label]) if label in table.baselines_of(part) else "—"
                 for part in parts]
        lines.append(f"| {label} (baseline) | " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot(table: Table, path: Path) -> None:
    """One panel per headline metric: a point per attention (its mean, written beside it;
    error bar: std over seeds), a dashed line per model-free baseline of that metric, the
    better direction in the title. The y axis spans the data and the baselines rather
    than starting at 0 (a 3 % gap would vanish on an axis from 0), and the panel says
    where it starts; points, not bars, so no length suggests a ratio to 0."""
    names = table.metrics
    columns = min(len(names), 4)
    fig = Figure(figsize=(min(4 * len(names), 16), 1.0 + 3.4 * math.ceil(len(names) / columns)))
    axes = fig.subplots(math.ceil(len(names) / columns), columns, squeeze=False).ravel()
    rows = list(table.rows)
    for ax, name in zip(axes, names):
        stats = [mean_std(table.values(row, name)) if table.values(row, name) else (math.nan, None) for row in rows]
        means = [m for m, _ in stats]
        ax.errorbar(range(len(rows)), means, yerr=[s or 0 for _, s in stats], fmt="o", capsize=4, color="tab:blue")
        for x, mean in enumerate(means):
            if not math.isnan(mean):
                ax.annotate(f"{mean:.4g}", (x, mean), xytext=(6, 0), textcoords="offset points", va="center",
                            fontsize=7)
        shown = [v for m, s in stats if not math.isnan(m) for v in (m - (s or 0), m + (s or 0))]
        for n, (label, baseline) in enumerate(table.baselines_of(name).items()):
            value = mean_std(table.baseline_values(baseline))[0]
            ax.axhline(value, color=f"C{n + 1}", linestyle="--", linewidth=1.2)
            ax.annotate(f"{label} {value:.4g}", (1, value), xycoords=("axes fraction", "data"), xytext=(-3, 2),
                        textcoords="offset points", ha="right", va="bottom", fontsize=7, color=f"C{n + 1}")
            shown.append(value)
        readable_ylim(ax, shown)
        ax.set_xlim(-0.5, len(rows) - 0.5)
        low = ax.get_ylim()[0]
        ax.set_xticks(range(len(rows)), [row.split("(")[0] if len(rows) > 1 else row for row in rows],
                      rotation=30, ha="right", fontsize=8)
        direction = better(name)
        ax.set_title(name + (f" ({direction} is better)" if direction else "")
                     + (f"\ny axis from {low:.4g}, not 0" if low > 0 else ""), fontsize=9)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    set_suptitle(fig, f"{table.group.title}\nmean over seeds, error bars: std; dashed: model-free baselines")
    fig.tight_layout()
    save_figure(fig, path)


def csv_text(tables: list[Table]) -> str:
    metrics = list(dict.fromkeys(m for t in tables for m in t.all_metrics()))
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
    each task, for lavo_tasks.compositional_index; tasks with more than one group are left out.
    A run counts under the patterns its configuration ran (`Task.site_patterns`: a
    summarization run counts at NC unless model.cross_causal=true)."""
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
        task_spec = tasks.load_task(task)
        patterns = [task_spec.site_patterns(run.cfg) for run in runs]  # the patterns each run ran
        for pattern in dict.fromkeys(p for run_patterns in patterns for p in run_patterns.values()):
            collected: dict[str, list[dict]] = {}
            for run, run_patterns in zip(runs, patterns):
                names = {run.cfg.model[s].name for s, p in run_patterns.items() if p == pattern}
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
    and one panel per data.variant and pattern of the site (self CS; cross NC or CC, whose
    states differ), over every finished mqar run whatever its other keys (a sweep over
    window, rank, slots and width). False when there is no such run."""
    points: dict[str, dict[str, dict[float, list[float]]]] = {}  # panel -> attention -> size -> accuracies
    for run in runs:
        if run.cfg is None or run.cfg.task != "mqar" or not run.metrics or "test_state_size" not in run.metrics:
            continue
        pattern = tasks.load_task("mqar").site_patterns(run.cfg)["attention"]
        panel = f"{run.cfg.data.variant} ({pattern})"
        by_size = points.setdefault(panel, {}).setdefault(run.cfg.model.attention.name, {})
        by_size.setdefault(run.metrics["test_state_size"], []).append(run.metrics["test_acc"])
    if not points:
        return False
    fig = Figure(figsize=(5 * len(points), 4))
    panels = sorted(points.items(), key=lambda item: (not item[0].startswith("self"), item[0]))  # self first
    for ax, (panel, lines) in zip(fig.subplots(1, len(points), squeeze=False)[0], panels):
        for name, by_size in sorted(lines.items()):
            sizes = sorted(by_size)
            color = f"C{sorted(ATTENTION_NAMES).index(name)}" if name in ATTENTION_NAMES else None  # one per attention
            ax.plot(sizes, [sum(by_size[s]) / len(by_size[s]) for s in sizes], marker="o", label=name, color=color)
        ax.set(xlabel="decode state per sequence and layer (numbers)", ylabel="test accuracy",
               ylim=(-0.02, 1.02), title=f"MQAR recall, {panel}")
        # Powers of two, written out: decimal decades leave a sweep's span of 2-8x with one label or none.
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
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
    from .run.cli import run_cli

    return run_cli(run, sys.argv[1:] if argv is None else argv, usage)


if __name__ == "__main__":
    sys.exit(main())
