"""docs/benchmarks.md's tables: the latest row of every cell, from the raw JSONL files."""

import json
from pathlib import Path

from lavo_tasks import bench_report

ROOT = Path(__file__).resolve().parents[2]
PAGE = "# page\nhand-written\n<!-- table: kernel-train -->\nstale\n<!-- end table -->\nafter\n"


def kernel(op, T, fwd, fwd_bwd, **extra):
    return {"date": "x", "gpu": "GPU-A", "torch": "9.9", "kind": "kernel", "op": op, "B": 65536 // T, "T": T,
            "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "peak_mib": 100.0, **extra}


def write(folder: Path, name: str, rows: list[dict]):
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def rendered(folder: Path, table: str) -> list[str]:
    """The lines of a page holding only `table`'s markers, after the report of folder's files."""
    page = folder / "page.md"
    page.write_text(f"<!-- table: {table} -->\n<!-- end table -->\n")
    assert bench_report.main([str(folder), "--page", str(page)]) == 0
    return page.read_text().splitlines()


def step(**fields):
    """A bench_e2e row of the steps table: tts's lavo at commit aaa, eager, on GPU-A."""
    return {"date": "2026-12-03", "device": "GPU-A", "torch": "9.9", "task": "tts", "attention": "lavo",
            "cross_fallback": False, "compile": "off", "commit": "aaa", "batch": 16, "samples_per_s": 1.0,
            "tokens_per_s": 1.0, "tokens_per_step": 2464, "step_ms": 100.0, "gpu_ms": 10.0, "syncs_per_step": 2,
            "peak_gib": 1.25, "params": 1, **fields}


def test_later_runs_replace_earlier_cells_and_are_marked(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    # Read order: 01-01 bare name, 01-01 run b, then 01-02 (whose failed row is no figure).
    write(bench, "2026-01-01-gpu-b.jsonl", [kernel("lavo", 1024, 0.5, 2.0) | {"date": "2026-01-01b"}])
    write(bench, "2026-01-01-gpu.jsonl", [kernel("lavo", 1024, 1.0, 4.0), kernel("softmax", 1024, 3.0, 9.0),
                                          kernel("softmax", 2048, 3.5, 9.5)])
    write(bench, "2026-01-02-gpu.jsonl", [{"kind": "kernel", "op": "softmax", "B": 64, "T": 1024, "error": "oom"}])
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    assert bench_report.main([str(bench)]) == 0
    assert page.read_text() == (
        "# page\nhand-written\n<!-- table: kernel-train -->\n"
        "| B x T | softmax (SDPA, FlashAttention) | lavo |\n"
        "|---|---|---|\n"
        "| 64 x 1K | 3.00 / 9.00 (100) | 0.50 / 2.00 (100)<sup>2</sup> |\n"
        "| 32 x 2K | 3.50 / 9.50 (100) |  |\n"
        "\n"
        "- unmarked cells: [bench/2026-01-01-gpu.jsonl](bench/2026-01-01-gpu.jsonl), x, GPU-A, torch 9.9\n"
        "- <sup>2</sup>: [bench/2026-01-01-gpu-b.jsonl](bench/2026-01-01-gpu-b.jsonl), 2026-01-01b, GPU-A, torch 9.9\n"
        "<!-- end table -->\nafter\n")
    assert bench_report.main([str(bench), "--check"]) == 0  # rerunning changes nothing


def test_check_fails_on_a_stale_page(tmp_path, capsys):
    bench = tmp_path / "bench"
    bench.mkdir()
    write(bench, "2026-01-01-gpu.jsonl", [kernel("gsa", 1024, 1.0, 4.0)])
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    assert bench_report.main([str(bench), "--check"]) == 1
    assert page.read_text() == PAGE
    assert "out of date" in capsys.readouterr().err


def test_a_row_no_table_takes_is_one_line_naming_its_file_and_line(tmp_path, capsys):
    bench = tmp_path / "bench"
    bench.mkdir()
    write(bench, "2026-01-01-gpu.jsonl", [kernel("gsa", 1024, 1.0, 4.0), {"kind": "new", "value": 1}])
    (tmp_path / "benchmarks.md").write_text(PAGE)
    assert bench_report.main([str(bench)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2026-01-01-gpu.jsonl:2: no table" in err and "kind, value" in err


def test_a_file_without_its_date_and_an_unknown_marker_are_refused(tmp_path, capsys):
    bench = tmp_path / "bench"
    bench.mkdir()
    write(bench, "gpu.jsonl", [kernel("gsa", 1024, 1.0, 4.0)])
    (tmp_path / "benchmarks.md").write_text(PAGE)
    assert bench_report.main([str(bench)]) == 2
    assert "must start with its date" in capsys.readouterr().err
    (bench / "gpu.jsonl").rename(bench / "2026-01-01-gpu.jsonl")
    (tmp_path / "benchmarks.md").write_text("<!-- table: nothing -->\n<!-- end table -->\n")
    assert bench_report.main([str(bench)]) == 2
    assert "table marker 'nothing'" in capsys.readouterr().err


def test_the_tasks_table_names_the_cross_fallback():
    row = {"task": "tts", "attention": "local", "cross_fallback": True, "batch": 16, "samples_per_s": 172.6,
           "tokens_per_s": 24683.2, "step_ms": 92.7, "peak_gib": 1.421, "params": 53_100_000}
    lines = bench_report.draw_tasks({("tts", "local", "H200"): row}, lambda key: "")
    assert lines[-1] == "| tts | local (cross: softmax) | 16 | 172.6 | 24,683 | 93 | 1.42 | 53.1M |"


def test_a_row_of_another_gpu_is_a_line_of_its_own_named_by_its_gpu(tmp_path):
    """Cells of two GPUs never replace each other; the lines then name their GPU (the
    device name without the vendor's)."""
    h100 = {"gpu": "NVIDIA H100 80GB HBM3"}
    write(tmp_path, "2026-01-01-a.jsonl", [kernel("lavo", 1024, 1.0, 4.0), kernel("softmax", 1024, 3.0, 9.0)])
    write(tmp_path, "2026-01-02-b.jsonl", [kernel("lavo", 1024, 0.5, 2.0) | h100, kernel("lavo", 2048, 0.6, 2.1) | h100])
    lines = rendered(tmp_path, "kernel-train")
    assert lines[3:6] == ["| 64 x 1K (GPU-A) | 3.00 / 9.00 (100) | 1.00 / 4.00 (100) |",
                          "| 64 x 1K (H100 80GB HBM3) |  | 0.50 / 2.00 (100)<sup>2</sup> |",
                          "| 32 x 2K (H100 80GB HBM3) |  | 0.60 / 2.10 (100)<sup>2</sup> |"]
    assert lines[-2].endswith("2026-01-02-b.jsonl), x, NVIDIA H100 80GB HBM3, torch 9.9")


def test_the_steps_table_keeps_each_gpus_lines_together(tmp_path):
    h200, h100 = {"task": "tsf", "device": "NVIDIA H200"}, {"task": "tsf", "device": "NVIDIA H100 80GB HBM3"}
    write(tmp_path, "2026-12-07-a.jsonl", [step(**h200), step(**h200, compile="reduce-overhead"),
                                           step(**h100), step(**h100, compile="reduce-overhead")])
    lines = rendered(tmp_path, "e2e-steps")
    assert [line.split(" | ")[:3] for line in lines[3:7]] == [["| tsf (H100 80GB HBM3)", "lavo", "off"],
                                                              ["| tsf (H100 80GB HBM3)", "lavo", "reduce-overhead"],
                                                              ["| tsf (H200)", "lavo", "off"],
                                                              ["| tsf (H200)", "lavo", "reduce-overhead"]]


def test_the_steps_table_keeps_a_row_per_compile_mode_and_commit_with_wall_over_gpu(tmp_path):
    write(tmp_path, "2026-12-03-a.jsonl", [step(), step(compile="default", step_ms=30.0, gpu_ms=8.0)])
    write(tmp_path, "2026-12-03-a-b.jsonl", [step(commit="bbb", step_ms=90.0, gpu_ms=9.0)])
    lines = rendered(tmp_path, "e2e-steps")
    assert lines[3:6] == ["| tts | lavo | default | aaa | 16 | 2,464 | 30.0 | 8.0 | 3.75 | 2 | 1.25 |",
                          "| tts | lavo | off | aaa | 16 | 2,464 | 100.0 | 10.0 | 10.00 | 2 | 1.25 |",
                          "| tts | lavo<sup>2</sup> | off | bbb | 16 | 2,464 | 90.0 | 9.0 | 10.00 | 2 | 1.25 |"]


def test_the_committed_page_is_up_to_date_with_docs_bench():
    assert bench_report.main([str(ROOT / "docs" / "bench"), "--check"]) == 0


def test_a_row_without_a_field_its_table_needs_is_one_line(tmp_path, capsys):
    bench = tmp_path / "bench"
    bench.mkdir()
    row = kernel("gsa", 1000, 1.0, 4.0)
    del row["peak_mib"]
    write(bench, "2026-01-01-gpu.jsonl", [kernel("gsa", 1000, 1.0, 4.0), row])
    (tmp_path / "benchmarks.md").write_text(PAGE)
    assert bench_report.main([str(bench)]) == 2
    assert "2026-01-01-gpu.jsonl:2: a row of table kernel-train lacks peak_mib" in capsys.readouterr().err
    assert bench_report.kernel_shape({"B": 3, "T": 1000}) == "3 x 1000"  # lengths that are not whole K


def test_a_missing_folder_or_page_is_one_line(tmp_path, capsys):
    assert bench_report.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such folder" in capsys.readouterr().err
    (tmp_path / "bench").mkdir()
    assert bench_report.main([str(tmp_path / "bench")]) == 2
    assert "benchmarks.md: no such page" in capsys.readouterr().err


def test_decode_rows_of_both_protocols(tmp_path):
    """bench_decode rows: one line each; a row without a state (the first protocol, whose
    one peak includes the encoder) shows '-' and marks its peak with *; a captured row
    timed over fewer than 256 tokens marks its wall time with a dagger and gives no
    wall / GPU (an eager one over as few keeps both)."""
    bench = tmp_path / "bench"
    bench.mkdir()
    row = {"date": "d", "device": "GPU-A", "torch": "9.9", "task": "summarization", "context": 4096, "beam": 4,
           "mode": "graph", "tokens": 256, "wall_ms": 3.0, "gpu_ms": 1.5, "kernels": 700.0, "peak_gib": 0.5}
    write(bench, "2026-01-01-gpu.jsonl", [row | {"attention": "lavo"}])
    write(bench, "2026-01-02-gpu.jsonl", [row | {"attention": "softmax", "wall_ms": 1.25, "gpu_ms": 1.0,
                                                 "state_gib": 0.125, "prepare_peak_gib": 2.0}])
    write(bench, "2026-01-03-gpu.jsonl", [row | {"attention": "gsa", "tokens": 32, "wall_ms": 0.5},
                                          row | {"attention": "gsa", "tokens": 32, "mode": "eager", "wall_ms": 6.0}])
    page = tmp_path / "benchmarks.md"
    page.write_text("<!-- table: e2e-decode -->\n<!-- end table -->\n")
    assert bench_report.main([str(bench)]) == 0
    lines = page.read_text().splitlines()
    assert lines[3] == ("| summarization | softmax<sup>3</sup> | 4K | 4 | graph | 1.25 | 1.00 | 1.25 | 700 | 0.125 | 0.500 "
                        "| 2.000 |")
    assert lines[4] == "| summarization | lavo<sup>2</sup> | 4K | 4 | graph | 3.00 | 1.50 | 2.00 | 700 | - | 0.500 * | - |"
    assert lines[5] == "| summarization | gsa | 4K | 4 | eager | 6.00 | 1.50 | 4.00 | 700 | - | 0.500 * | - |"
    assert lines[6] == "| summarization | gsa | 4K | 4 | graph | 0.50 † | 1.50 | - | 700 | - | 0.500 * | - |"


def test_a_kernel_cell_shows_the_graphed_time_where_it_was_measured():
    assert bench_report.kernel_cell(kernel("lavo", 1024, 0.14, 1.06, graph_fwd_bwd_ms=0.4)) == "0.14 / 1.06 [0.40] (100)"
    assert bench_report.kernel_cell(kernel("lavo", 1024, 0.14, 1.06)) == "0.14 / 1.06 (100)"
    assert bench_report.kernel_cell(kernel("lavo", 1024, 0.14, 1.06, graph_error="x")) == "0.14 / 1.06 [error] (100)"
