"""Write the generated tables of docs/benchmarks.md from the raw rows in docs/bench/.

    python -m lavo_tasks.bench_report docs/bench [--page docs/benchmarks.md] [--check]

The page is hand-written except between the marker lines

    <!-- table: NAME -->
    ...
    <!-- end table -->

which this module rewrites from every *.jsonl file of the folder (NAME is one of TABLES).
Files are read oldest first: a file's name starts with its date (YYYY-MM-DD), and the runs
of one day are told apart by a letter at the end of the name (the bare name first, then
-b, -c, ...). A later row replaces an earlier one with the same key, so every cell of a
table is the latest measurement of it, and the sources under the table name the file,
date, device and torch of each cell. The GPU is part of every key: a row measured on
another GPU is a cell of its own, never a replacement, and where a table holds several
GPUs each line names its own. Rows carrying an "error" (a measurement that failed,
e.g. out of memory) are not figures and are skipped; any other row that no table takes is
an error, so a new kind of measurement cannot vanish from the page unnoticed.

--check writes nothing and exits 1 when the page differs from what it would write.
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MARKER = re.compile(r"^<!-- table: ([a-z0-9-]+) -->\n.*?^<!-- end table -->\n", re.M | re.S)
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}-")
RUN_LETTER = re.compile(r"-([a-z])$")

KERNEL_OPS = ["softmax", "softmax_default", "local", "lavo", "gsa", "fla_gsa"]
OP_HEADERS = {"softmax": "softmax (SDPA, FlashAttention)", "softmax_default": "softmax_default (SDPA, no backend forced)",
              "local": "local (flex, w=128)", "lavo": "lavo", "gsa": "gsa", "fla_gsa": "fla `chunk_gsa`"}
ATTENTIONS = ["softmax", "local", "lavo", "gsa"]


class ReportError(Exception):
    """Bad input to the report: the message is one line naming the file or marker."""


def file_order(path: Path) -> tuple:
    """Sort key: date, then run letter ('' for the bare name), then the name itself."""
    if not DATE.match(path.name):
        raise ReportError(f"{path}: a raw file's name must start with its date, YYYY-MM-DD-")
    letter = RUN_LETTER.search(path.stem)
    return path.name[:10], letter.group(1) if letter else "", path.name


def read_rows(folder: Path) -> list[tuple[Path, int, dict]]:
    """(file, line number, row) for every measurement in folder's *.jsonl, oldest first."""
    rows = []
    for path in sorted(folder.glob("*.jsonl"), key=file_order):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ReportError(f"{path}:{number}: not a JSON object ({err.msg})") from None
            if "error" not in row:
                rows.append((path, number, row))
    return rows


def fmt_k(value: float) -> str:
    return f"{value / 1000:.0f}K"


def fmt_mib(value: float) -> str:
    return f"{value / 1024:.0f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def fmt_params(value: int) -> str:
    return f"{value / 1e6:.1f}M"


def device_of(r: dict) -> str:
    """The device a row was measured on, as recorded (bench writes "gpu", the others
    "device")."""
    return r.get("gpu") or r.get("device") or "device not recorded"


def gpu_name(r: dict) -> str:
    """The GPU of a row: its device name without the vendor ("H100 80GB HBM3" of "NVIDIA
    H100 80GB HBM3"), whole otherwise, so that two models never share a name."""
    return device_of(r).removeprefix("NVIDIA ")


def several_gpus(keys) -> bool:
    """Whether the cells' keys, each ending in the GPU's name, name more than one GPU."""
    return len({key[-1] for key in keys}) > 1


def on_gpu(label: str, key: tuple, several: bool) -> str:
    """label, followed by the key's GPU (its last part) where the table holds several."""
    return f"{label} ({key[-1]})" if several else label


def order(values, preferred: list) -> list:
    """values in the order of preferred, then any others sorted."""
    values = set(values)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def task_then_attention(key: tuple) -> tuple:
    """A sort key for cells keyed (task, attention, ...): attentions in ATTENTIONS' order,
    any others after them by name, then the rest of the key."""
    task, attention, *rest = key
    return (task, ATTENTIONS.index(attention) if attention in ATTENTIONS else len(ATTENTIONS), attention, *rest)


def by_gpu_within_attention(key: tuple) -> tuple:
    """A sort key for cells keyed (task, attention, ..., GPU): task_then_attention's, with
    the GPU moved up to just after the attention, so each GPU's lines stand together."""
    task, attention, *rest, gpu = key
    return task_then_attention((task, attention, gpu, *rest))


@dataclass(frozen=True)
class Table:
    """One generated table: which rows it takes, each row's key, and how its cells are drawn."""

    name: str
    takes: Callable[[dict], bool]
    fields: tuple[str, ...]  # what every row it takes must hold
    key: Callable[[dict], tuple]
    draw: Callable[[dict, Callable[[tuple], str]], list[str]]  # (cells by key, key -> source mark) -> lines


def wide(row_label, corner: str, columns: list[str], cell, headers: dict[str, str] | None = None):
    """draw for keys (attention, row key ending in the GPU): rows sorted by row key,
    attentions across."""
    headers = headers or {}

    def draw(cells, source):
        ops = order({op for op, _ in cells}, columns)
        several = several_gpus(rk for _, rk in cells)
        lines = [f"| {corner} | " + " | ".join(headers.get(op, op) for op in ops) + " |", "|---" * (len(ops) + 1) + "|"]
        for rk in sorted({rk for _, rk in cells}):
            first = next(cells[(op, rk)] for op in ops if (op, rk) in cells)
            shown = [cell(cells[(op, rk)]) + source((op, rk)) if (op, rk) in cells else "" for op in ops]
            lines.append(f"| {on_gpu(row_label(first), rk, several)} | " + " | ".join(shown) + " |")
        return lines

    return draw


def draw_tasks(cells, source):
    """draw for keys (task, attention, GPU): one line per run of bench_e2e."""
    lines = ["| task | attention | batch | samples/s | tokens/s | step ms | peak GiB | params |",
             "|---|---|---|---|---|---|---|---|"]
    several = several_gpus(cells)
    for key in sorted(cells, key=by_gpu_within_attention):
        task, attention, _ = key
        r = cells[key]
        label = f"{attention} (cross: softmax)" if r.get("cross_fallback") else attention
        lines.append(f"| {on_gpu(task, key, several)} | {label}{source(key)} | {r['batch']} | {r['samples_per_s']:.1f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['step_ms']:.0f} | {r['peak_gib']:.2f} | {fmt_params(r['params'])} |")
    return lines


def draw_steps(cells, source):
    """draw for keys (task, attention, compile, commit, GPU): bench_e2e's wall and GPU time
    per step, one line per run; `commit` names the code measured (before / after a change)."""
    lines = ["| task | attention | compile | commit | batch | tokens / step | step ms (wall) | GPU ms | wall / GPU "
             "| syncs / step | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    several = several_gpus(cells)
    for key in sorted(cells, key=by_gpu_within_attention):
        task, attention, compile_mode, commit, _ = key
        r = cells[key]
        label = f"{attention} (cross: softmax)" if r.get("cross_fallback") else attention
        lines.append(f"| {on_gpu(task, key, several)} | {label}{source(key)} | {compile_mode} | {commit} | {r['batch']} | "
                     f"{r['tokens_per_step']:,} | {r['step_ms']:.1f} | {r['gpu_ms']:.1f} | "
                     f"{r['step_ms'] / r['gpu_ms']:.2f} | {r['syncs_per_step']} | {r['peak_gib']:.2f} |")
    return lines


def fmt_len(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def kernel_shape(r: dict) -> str:
    return f"{r['B']} x {fmt_len(r['T'])}"


def pattern_shape(r: dict) -> str:
    """`NS, 64 x 1K`; cross patterns `CC, 8 x 512 over 1K` (target positions over the source)."""
    if "target" in r:
        return f"{r['pattern']}, {r['B']} x {fmt_len(r['target'])} over {fmt_len(r['T'])}"
    return f"{r['pattern']}, {kernel_shape(r)}"


WALL_TOKENS = 256  # bench_decode's default: the fewest tokens whose captured wall time is kept


def draw_decode(cells, source):
    """draw for keys (task, attention, context, beam, mode, GPU): one line per bench_decode row.
    A row of the first protocol (the context read inside each run) has no state and one
    peak, the encoder or prefill included: shown in the decode peak column, marked *.
    A captured row timed over fewer than WALL_TOKENS tokens has its wall time marked †
    and no wall / GPU: the capture's host time, which varies by tens of ms from call to
    call, does not cancel between its long and short runs."""
    lines = ["| task | attention | context | beam | mode | wall ms / token | GPU ms / token | wall / GPU "
             "| kernels / token | state GiB | decode peak GiB | prepare peak GiB |", "|---" * 12 + "|"]
    several = several_gpus(cells)
    for key in sorted(cells, key=by_gpu_within_attention):
        r = cells[key]
        state = f"{r['state_gib']:.3f}" if "state_gib" in r else "-"
        peak = f"{r['peak_gib']:.3f}" + ("" if "state_gib" in r else " *")
        prepare = f"{r['prepare_peak_gib']:.3f}" if "prepare_peak_gib" in r else "-"
        short = r["mode"] == "graph" and r["tokens"] < WALL_TOKENS
        wall = f"{r['wall_ms']:.2f}" + (" †" if short else "")
        ratio = "-" if short else f"{r['wall_ms'] / r['gpu_ms']:.2f}"
        lines.append(f"| {on_gpu(r['task'], key, several)} | {r['attention']}{source(key)} | {fmt_len(r['context'])} | {r['beam']} "
                     f"| {r['mode']} | {wall} | {r['gpu_ms']:.2f} | {ratio} "
                     f"| {r['kernels']:.0f} | {state} | {peak} | {prepare} |")
    return lines


def graphed(r: dict) -> str:
    """" [ms]" of a kernel row's fwd+bwd replayed from a CUDA graph, " [error]" where its
    capture failed, "" where it was not measured."""
    if "graph_fwd_bwd_ms" in r:
        return f" [{r['graph_fwd_bwd_ms']:.2f}]"
    return " [error]" if "graph_error" in r else ""


def kernel_cell(r: dict) -> str:
    """fwd / fwd+bwd ms [graphed] (peak MiB)."""
    return f"{r['fwd_ms']:.2f} / {r['fwd_bwd_ms']:.2f}{graphed(r)} ({r['peak_mib']:.0f})"


TABLES = [
    Table("kernel-train", lambda r: r.get("kind") == "kernel" and r.get("pattern", "CS") == "CS", ("op", "B", "T", "fwd_ms", "fwd_bwd_ms", "peak_mib"),
          lambda r: (r["op"], (r["T"], r["B"], gpu_name(r))),
          wide(kernel_shape, "B x T", KERNEL_OPS,
               kernel_cell, OP_HEADERS)),
    Table("kernel-patterns", lambda r: r.get("kind") == "kernel" and r.get("pattern", "CS") != "CS",
          ("op", "pattern", "B", "T", "fwd_ms", "fwd_bwd_ms", "peak_mib"),
          lambda r: (r["op"], (r["pattern"], r["T"], r["B"], gpu_name(r))),
          wide(pattern_shape, "pattern, shape", KERNEL_OPS,
               kernel_cell, OP_HEADERS)),
    Table("kernel-decode", lambda r: r.get("kind") == "decode", ("op", "B", "T", "decode_ms", "state_mib"),
          lambda r: (r["op"], (r["T"], r["B"], gpu_name(r))),
          wide(kernel_shape, "batch x context", KERNEL_OPS,
               lambda r: f"{r['decode_ms']:.3f} ms, {fmt_mib(r['state_mib'])}",
               {"softmax": "softmax (SDPA + KV cache)", "fla_gsa": "fla `fused_recurrent_gsa`"})),
    Table("e2e-lm-length", lambda r: "task" not in r and "tokens_per_s" in r, ("attention", "T", "step_ms"),
          lambda r: (r["attention"], (r["T"], gpu_name(r))),
          wide(lambda r: fmt_len(r["T"]), "T", ATTENTIONS,
               lambda r: f"{fmt_k(r['tokens_per_s'])} ({r['step_ms']:.0f})")),
    Table("e2e-steps", lambda r: "task" in r and "gpu_ms" in r and "mode" not in r,  # decode rows: e2e-decode
          ("attention", "compile", "commit", "batch", "tokens_per_step", "step_ms", "gpu_ms", "syncs_per_step",
           "peak_gib"), lambda r: (r["task"], r["attention"], r["compile"], r["commit"], gpu_name(r)), draw_steps),
    Table("e2e-tasks", lambda r: "task" in r and "samples_per_s" in r,
          ("attention", "batch", "tokens_per_s", "step_ms", "peak_gib", "params"), lambda r: (r["task"], r["attention"], gpu_name(r)),
          draw_tasks),
    Table("e2e-decode", lambda r: "task" in r and "mode" in r and "wall_ms" in r,
          ("attention", "context", "beam", "mode", "wall_ms", "gpu_ms", "kernels", "peak_gib"),
          lambda r: (r["task"], r["attention"], r["context"], r["beam"], r["mode"], gpu_name(r)), draw_decode),
]


def build_tables(rows: list[tuple[Path, int, dict]]) -> dict[str, str]:
    """Markdown of every table (its lines and its sources), from rows oldest first."""
    cells = {t.name: {} for t in TABLES}
    origin = {t.name: {} for t in TABLES}
    for path, number, row in rows:
        table = next((t for t in TABLES if t.takes(row)), None)
        if table is None:
            raise ReportError(f"{path}:{number}: no table in lavo_tasks/bench_report.py takes this row "
                              f"(keys: {', '.join(sorted(row))}); add one")
        missing = [field for field in table.fields if field not in row]
        if missing:
            raise ReportError(f"{path}:{number}: a row of table {table.name} lacks {', '.join(missing)}")
        key = table.key(row)
        cells[table.name][key] = row
        origin[table.name][key] = path
    out = {}
    for table in TABLES:
        if not cells[table.name]:
            continue
        # The file most cells came from is unmarked; the others get a number each.
        counts: dict[Path, int] = {}
        for path in origin[table.name].values():
            counts[path] = counts.get(path, 0) + 1
        files = sorted(counts, key=lambda p: (-counts[p], file_order(p)))
        marks = {path: (f"<sup>{i}</sup>" if i > 1 else "") for i, path in enumerate(files, 1)}
        lines = table.draw(cells[table.name], lambda key, t=table.name: marks[origin[t][key]])
        lines.append("")
        for i, path in enumerate(files, 1):
            sample = next(cells[table.name][k] for k, p in origin[table.name].items() if p == path)
            device = device_of(sample)
            which = "unmarked cells" if i == 1 else f"<sup>{i}</sup>"
            lines.append(f"- {which}: [bench/{path.name}](bench/{path.name}), {sample.get('date', path.name[:10])}, "
                         f"{device}, torch {sample.get('torch', 'not recorded')}")
        out[table.name] = "\n".join(lines) + "\n"
    return out


def render(page: str, tables: dict[str, str]) -> str:
    """page with the text between each table's markers replaced by that table."""
    known = {t.name for t in TABLES}

    def fill(match):
        name = match.group(1)
        if name not in known:
            raise ReportError(f"table marker '{name}' in the page: no such table (known: {', '.join(sorted(known))})")
        if name not in tables:
            raise ReportError(f"table marker '{name}' in the page: no raw row in the folder fills it")
        return f"<!-- table: {name} -->\n{tables[name]}<!-- end table -->\n"

    return MARKER.sub(fill, page)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lavo_tasks.bench_report", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the raw files' folder (docs/bench)")
    p.add_argument("--page", help="the page to update (default: benchmarks.md beside the folder)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    page = Path(args.page) if args.page else folder.parent / "benchmarks.md"
    try:
        if not folder.is_dir():
            raise ReportError(f"{folder}: no such folder (the raw benchmark files, e.g. docs/bench)")
        if not page.is_file():
            raise ReportError(f"{page}: no such page (--page names the Markdown file to update)")
        text = page.read_text()
        new = render(text, build_tables(read_rows(folder)))
    except ReportError as err:
        print(f"bench_report: {err}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"bench_report: {page} is out of date with {folder}; run python -m lavo_tasks.bench_report {folder}",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        page.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
