"""The comparison report on made-up run folders: grouping by configuration, mean ± std,
failed and damaged runs listed, CAB's compositional index against hand-computed values."""

import csv
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lavo_tasks import report
from lavo_tasks.compositional_index import cab_dataset, compositional_index
from lavo_tasks.config import compose


def make_run(root: Path, name: str, args: list[str], metrics: dict | None, resources: dict | None = None) -> Path:
    """A run folder as the runner leaves it: config.yaml, metrics.json, metrics.meta.json."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    OmegaConf.save(compose([*args, f"run.dir={run_dir}"]), run_dir / "config.yaml")
    if metrics is not None:
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        meta = {"command": "train"} | ({"resources": resources} if resources else {})
        (run_dir / "metrics.meta.json").write_text(json.dumps(meta))
    return run_dir


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_table_groups_by_config_and_averages_seeds(tmp_path, capsys):
    res = {"wall_s": 10.0, "peak_memory_bytes": 2**20 * 100, "memory": "cpu_peak_rss", "parameters": 1234}
    for seed, mse in ((0, 1.0), (1, 3.0)):
        make_run(tmp_path, f"soft{seed}", ["task=tsf", "attention=softmax", f"seed={seed}"],
                 {"test_mse": mse, "test_last_value_mse": 0.5}, res | {"wall_s": 10.0 + 2 * seed})
    make_run(tmp_path, "lavo0", ["task=tsf", "attention=lavo"], {"test_mse": 2.0, "test_last_value_mse": 0.5}, res)
    # Another width: its own group, never averaged with the others.
    make_run(tmp_path, "wide", ["task=tsf", "attention=softmax", "model.d_model=128"], {"test_mse": 100.0}, res)
    # Sites that differ: one row naming each site.
    make_run(tmp_path, "mixed", ["task=tsf", "model.cross_attention=gsa"], {"test_mse": 7.0}, res)
    text = report.write_report([tmp_path], tmp_path / "out")
    rows = read_csv(tmp_path / "out" / "report.csv")
    soft = [r for r in rows if r["attention"] == "softmax(alibi=False)" and "model.d_model=64" in r["group"]]
    assert len(soft) == 1 and soft[0]["n_seeds"] == "2"
    assert float(soft[0]["test_mse_mean"]) == pytest.approx(2.0)
    assert float(soft[0]["test_mse_std"]) == pytest.approx(math.sqrt(2.0))  # sample std of 1 and 3
    assert float(soft[0]["wall_s_mean"]) == pytest.approx(11.0)
    assert soft[0]["parameters"] == "1234" and float(soft[0]["peak_memory_mib_mean"]) == pytest.approx(100)
    wide = [r for r in rows if "model.d_model=128" in r["group"]]
    assert len(wide) == 1 and float(wide[0]["test_mse_mean"]) == 100.0 and wide[0]["n_seeds"] == "1"
    assert "model.d_model=64" in soft[0]["group"]  # the key that sets the groups apart is named
    mixed = [r for r in rows if "cross gsa" in r["attention"]]
    assert len(mixed) == 1 and "encoder softmax" in mixed[0]["attention"]
    assert "2 configuration group(s)" in text
    assert "| softmax(alibi=False) | 2 ± 1.4 |" in text
    assert "| baseline | test_mse ↓ |\n|---|---|\n| last_value | 0.5 |" in text  # baselines apart, not a column
    assert (tmp_path / "out" / "report-1.png").stat().st_size > 0 and (tmp_path / "out" / "report-2.png").is_file()


PCC_CATEGORIES = ("02691156", "03001627")


def pcc_metrics(cd_l1: float) -> dict:
    """A pcc run's metrics.json: headline, per category, and the partial cloud's (the baseline)."""
    metrics = {"test_cd_l1": cd_l1, "test_cd_l2": cd_l1 / 30, "test_fscore": 0.5}
    for n, category in enumerate(PCC_CATEGORIES):
        metrics |= {f"test_cd_l1_{category}": cd_l1 + n, f"test_cd_l2_{category}": 0.2, f"test_fscore_{category}": 0.5}
        metrics |= {f"test_partial_cd_l1_{category}": 12.0 + n, f"test_partial_cd_l2_{category}": 0.6,
                    f"test_partial_fscore_{category}": 0.3}
    return metrics | {"test_partial_cd_l1": 12.5, "test_partial_cd_l2": 0.6, "test_partial_fscore": 0.3}


def test_a_column_per_headline_metric_breakdowns_and_baselines_apart(tmp_path):
    for attention, cd_l1 in (("softmax", 7.0), ("gsa", 7.5)):
        make_run(tmp_path, attention, ["task=pcc", f"attention={attention}"], pcc_metrics(cd_l1))
    text = report.write_report([tmp_path], tmp_path / "out")
    header = next(line for line in text.splitlines() if line.startswith("| attention | test_cd_l1"))
    assert header.split(" | ")[1:5] == ["test_cd_l1 ↓", "test_cd_l2 ↓", "test_fscore ↑", "n seeds"]
    assert "| baseline | test_cd_l1 ↓ | test_cd_l2 ↓ | test_fscore ↑ |\n|---|---|---|---|\n| partial | 12.5 | 0.6 | 0.3 |" in text
    assert ("test_cd_l1 ↓ by part (test_cd_l1_<part>):\n\n| attention | 02691156 | 03001627 |\n|---|---|---|\n"
            "| gsa(slots=64, tau=8.0) | 7.5 | 8.5 |\n| softmax(alibi=False) | 7 | 8 |\n"
            "| partial (baseline) | 12 | 13 |") in text
    row = read_csv(tmp_path / "out" / "report.csv")[0]
    assert row["attention"].startswith("gsa") and float(row["test_cd_l1_03001627_mean"]) == 8.5 and float(row["test_partial_cd_l1_mean"]) == 12.5


def test_better_directions():
    assert [report.better(n) for n in ("test_mse", "test_cd_l1", "test_ppl", "test_decode_acc", "test_fscore",
                                       "test_rougeL", "test_length_ratio", "test_generated_len")] == \
        ["lower", "lower", "lower", "higher", "higher", "higher", "", ""]


def test_plot_starts_near_the_data_draws_baselines_and_says_which_way_is_better(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig))
    for attention, mse in (("softmax", 0.0737), ("lavo", 0.0719), ("gsa", 0.0700)):
        make_run(tmp_path, attention, ["task=tsf", f"attention={attention}"],
                 {"test_mse": mse, "test_length_ratio": 1.0, "test_last_value_mse": 0.0693, "test_linear_mse": 0.056})
    report.write_report([tmp_path], tmp_path / "out")
    mse_panel, ratio_panel = (ax for ax in figures[0].axes if ax.get_visible())
    low, high = mse_panel.get_ylim()
    assert 0 < low < 0.056 and 0.0737 < high < 0.1  # near the data and the baselines, not from 0
    assert mse_panel.get_title() == f"test_mse (lower is better)\ny axis from {low:.4g}, not 0"
    flat_lines = {line.get_ydata()[0] for line in mse_panel.get_lines() if len(set(line.get_ydata())) == 1}
    assert {0.0693, 0.056} <= flat_lines
    assert {t.get_text() for t in mse_panel.texts} >= {"last_value 0.0693", "linear 0.056", "0.07", "0.0737"}
    assert ratio_panel.get_title().startswith("test_length_ratio\n")  # no better direction


def test_failed_and_damaged_runs_are_listed(tmp_path):
    make_run(tmp_path, "ok", ["task=tsf", "attention=gsa"], {"test_mse": 1.0})
    make_run(tmp_path, "missing", ["task=tsf", "attention=gsa", "seed=1"], None)
    damaged = make_run(tmp_path, "damaged", ["task=tsf", "attention=gsa", "seed=2"], None)
    (damaged / "metrics.json").write_text("{\"test_mse\": 1.")
    (damaged / "metrics.meta.json").write_text("{}")
    (tmp_path / "missing" / "error.txt").write_text("exit code 1: CUDA out of memory\n")
    text = report.write_report([tmp_path], tmp_path / "out")
    row = read_csv(tmp_path / "out" / "report.csv")[0]
    assert (row["n_seeds"], row["failed"]) == ("1", "2")
    assert f"- {tmp_path / 'missing'}: metrics.json missing; exit code 1: CUDA out of memory" in text
    assert f"- {tmp_path / 'damaged'}: metrics.json damaged (JSONDecodeError)" in text


def test_folders_without_runs_fail_as_one_line(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert report.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: no run (a folder with config.yaml) in: {tmp_path / 'a'}, {tmp_path / 'b'}\n"


def test_compositional_index_by_hand(tmp_path):
    # tsf (sites NS, CS, NC) and lm (CS); report mu/sigma (not CAB's configuration).
    tsf = {"softmax": [(0.9, 0.3), (1.1, 0.3)], "lavo": [(2.0, 0.1)], "gsa": [(3.0, 0.2)]}  # (mse, mae) per seed
    for attention, seeds in tsf.items():
        for seed, (mse, mae) in enumerate(seeds):
            make_run(tmp_path, f"tsf-{attention}-{seed}", ["task=tsf", f"attention={attention}", f"seed={seed}"],
                     {"test_mse": mse, "test_mae": mae, "test_mase": 9.0})
    for attention, ppl in (("softmax", 10.0), ("lavo", 12.0), ("gsa", 14.0)):
        make_run(tmp_path, f"lm-{attention}", ["task=lm", f"attention={attention}"], {"test_ppl": ppl})
    text = report.write_report([tmp_path], tmp_path / "out")
    got = {(r["pattern"], r["attention"]): float(r["index"]) for r in read_csv(tmp_path / "out" / "compositional_index.csv")}
    # tsf means: mse 1, 2, 3 (mu 2, population sigma sqrt(2/3)); mae .3, .1, .2 (mu .2, sigma sqrt(.02/3)).
    # z (lower is better, sign -1): softmax mse +1.2247, mae -1.2247 -> 0; lavo 0, +1.2247 -> .61237;
    # gsa -1.2247, 0 -> -.61237. lm ppl 10, 12, 14 (mu 12, sigma sqrt(8/3)): +1.2247, 0, -1.2247.
    r = math.sqrt(1.5)  # 1.2247: one sigma over sqrt(2/3)
    expected_tsf = {"softmax": 0.0, "lavo": r / 2, "gsa": -r / 2}
    expected_lm = {"softmax": r, "lavo": 0.0, "gsa": -r}
    for attention in ("softmax", "lavo", "gsa"):
        for pattern in ("NS", "NC"):  # tsf alone
            assert got[(pattern, attention)] == pytest.approx(expected_tsf[attention], abs=1e-5)
        assert got[("CS", attention)] == pytest.approx((expected_tsf[attention] + expected_lm[attention]) / 2, abs=1e-5)
    assert "mu/sigma over the attentions in this report" in text
    assert "CC" not in got  # neither task has causal cross-attention


def test_cab_mu_sigma_on_cabs_configuration():
    # lm at CAB's preset on real data: CAB's CS numbers for LM PPL, mu 22.26 and sigma 8.29944.
    index, source, _ = compositional_index({"CS": {"lm": {"lavo": {"test_ppl": 30.56}}}}, {"lm": "lm"})
    assert source["CS"] == "CAB"
    assert index["CS"]["lavo"] == (pytest.approx(-(30.56 - 22.26) / 8.29944), 1)
    # One task off CAB's configuration: the whole pattern falls back to the report's own figures.
    results = {"CS": {"lm": {"a": {"test_ppl": 10.0}, "b": {"test_ppl": 20.0}},
                      "tsf": {"a": {"test_mse": 1.0, "test_mae": 1.0}, "b": {"test_mse": 1.0, "test_mae": 2.0}}}}
    index, source, notes = compositional_index(results, {"lm": "lm", "tsf": None})
    assert source["CS"] == "report"
    # lm: z(a) = +1, z(b) = -1; tsf: mse has no spread (left out), mae z(a) = +1, z(b) = -1.
    assert index["CS"]["a"] == (pytest.approx(1.0), 2) and index["CS"]["b"] == (pytest.approx(-1.0), 2)
    assert any("test_mse left out" in note for note in notes)


def test_cab_dataset_from_preset_and_path():
    assert cab_dataset("tsf", "cab", "/data/ETTh1.csv") == "tsf:ETT"
    assert cab_dataset("tsf", "cab", "/data/weather.csv") == "tsf:Weather"
    assert cab_dataset("tsf", "cab", "/data/my_sales.csv") is None
    assert cab_dataset("tsf", "default", "/data/ETTh1.csv") is None
    assert cab_dataset("lm", "cab", "") is None  # the embedded default data is not CAB's
    assert cab_dataset("lm", "cab", "/data/pg19") == "lm"


@pytest.mark.parametrize("cross_causal", [False, True], ids=["NC-default", "CC"])
def test_index_files_summarization_under_the_cross_pattern_it_ran(tmp_path, cross_causal):
    # tsf (NS, CS, NC) beside summarization (NS, CS, and NC by default, CC with cross_causal=true).
    # tsf mse = mae 1, 2, 3 (lower is better): z +r, 0, -r for softmax, lavo, gsa.
    # summarization ROUGE 14, 10, 12 (higher is better): z +r, -r, 0.
    r = math.sqrt(1.5)
    extra = ["model.cross_causal=true"] if cross_causal else []
    for attention, value, rouge in (("softmax", 1.0, 14.0), ("lavo", 2.0, 10.0), ("gsa", 3.0, 12.0)):
        make_run(tmp_path, f"tsf-{attention}", ["task=tsf", f"attention={attention}"],
                 {"test_mse": value, "test_mae": value})
        make_run(tmp_path, f"sum-{attention}", ["task=summarization", f"attention={attention}", *extra],
                 {"test_rouge1": rouge, "test_rouge2": rouge, "test_rougeL": rouge})
    report.write_report([tmp_path], tmp_path / "out")
    got = {(row["pattern"], row["attention"]): (float(row["index"]), int(row["n_tasks"]))
           for row in read_csv(tmp_path / "out" / "compositional_index.csv")}
    tsf = {"softmax": r, "lavo": 0.0, "gsa": -r}
    summarization = {"softmax": r, "lavo": -r, "gsa": 0.0}
    for attention in tsf:
        if cross_causal:  # NC: tsf alone; CC: summarization alone
            assert got[("NC", attention)] == (pytest.approx(tsf[attention]), 1)
            assert got[("CC", attention)] == (pytest.approx(summarization[attention]), 1)
        else:  # NC: both tasks; no CC run
            assert got[("NC", attention)] == (pytest.approx((tsf[attention] + summarization[attention]) / 2), 2)
            assert ("CC", attention) not in got


def test_mqar_runs_get_the_recall_plot(tmp_path, monkeypatch):
    """The recall plot's points: test_acc averaged over seeds at each state size, per attention and panel
    (variant and pattern)."""
    for seed, acc in ((0, 0.5), (1, 0.7)):
        make_run(tmp_path, f"gsa{seed}", ["task=mqar", "attention=gsa", f"seed={seed}"],
                 {"test_acc": acc, "test_state_size": 2048.0})
    make_run(tmp_path, "gsa_big", ["task=mqar", "attention=gsa", "attention.slots=64"],
             {"test_acc": 0.9, "test_state_size": 8192.0})
    make_run(tmp_path, "soft_cross", ["task=mqar", "data.variant=cross"], {"test_acc": 1.0, "test_state_size": 2048.0})
    make_run(tmp_path, "soft_cc", ["task=mqar", "data.variant=cross", "model.cross_causal=true"],
             {"test_acc": 0.8, "test_state_size": 2048.0})  # CC: a panel of its own, not averaged with NC
    make_run(tmp_path, "lm", ["task=lm"], {"test_ppl": 3.0})  # not an mqar run: not plotted
    drawn = []
    monkeypatch.setattr(report.Figure, "subplots", _recording_subplots(report.Figure.subplots, drawn))
    text = report.write_report([tmp_path], tmp_path / "out")
    assert "![recall against state size](recall.png)" in text
    assert (tmp_path / "out" / "recall.png").stat().st_size > 0
    lines = {(ax.get_title(), line.get_label()): list(zip(*line.get_data())) for ax in drawn for line in ax.get_lines()
             if ax.get_title().startswith("MQAR")}  # (the tables' bar charts are drawn too)
    assert lines[("MQAR recall, self (CS)", "gsa")] == [(2048.0, pytest.approx(0.6)), (8192.0, 0.9)]
    assert lines[("MQAR recall, cross (NC)", "softmax")] == [(2048.0, 1.0)]
    assert lines[("MQAR recall, cross (CC)", "softmax")] == [(2048.0, 0.8)]
    assert len(lines) == 3
    recall_axes = [ax for ax in drawn if ax.get_title().startswith("MQAR")]
    assert all(ax.xaxis.get_major_formatter()(2048.0, 0) == "2,048" for ax in recall_axes)  # sizes written out


def _recording_subplots(subplots, drawn: list):
    """Figure.subplots that also keeps the axes it makes in `drawn`."""
    def wrapped(fig, *args, **kwargs):
        axes = subplots(fig, *args, **kwargs)
        drawn.extend(getattr(axes, "ravel", lambda: [axes])())
        return axes
    return wrapped
