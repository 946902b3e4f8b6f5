"""The forecasting loader on small CSV files in the ETT / Informer layout written here:
splits, scaling fit on the training rows only, windows, time features, modes, the
embedded default, and every bad-input error."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from lavo_tasks.config import compose, validate
from lavo_tasks.default_data import cache_root
from lavo_tasks.errors import ConfigError
from lavo_tasks.tasks import tsf
from lavo_tasks.tasks.tsf.data import TSFDataModule, read_series_csv, split_borders, time_features, write_default_csv


def write_csv(path: Path, rows: int, freq: str, columns=("a", "OT"), start="2016-07-01 00:00:00") -> Path:
    """Column k holds row_index * (k + 1), so every statistic is known in closed form."""
    frame = pd.DataFrame({"date": pd.date_range(start, periods=rows, freq=freq).strftime("%Y-%m-%d %H:%M:%S")})
    for k, name in enumerate(columns):
        frame[name] = np.arange(rows) * (k + 1)
    frame.to_csv(path, index=False)
    return path


def config(tmp_path: Path, path: Path | str = "", **data):
    cfg = compose(["task=tsf", f"run.dir={tmp_path / 'run'}", f"data.path={path}"])
    for key, value in data.items():
        OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    return cfg


def setup(cfg) -> TSFDataModule:
    dm = TSFDataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_etth_split_scaler_and_windows(tmp_path):
    path = write_csv(tmp_path / "h.csv", 14_500, "h")  # rows past 14,400 are unused (Informer)
    dm = setup(config(tmp_path, path, seq_len=24, label_len=12, pred_len=6, mode="M"))
    train, val, test = (dm.datasets[s] for s in ("train", "val", "test"))
    # 12 / 4 / 4 months of 30 days: [0, 8640), [8640 - 24, 11520), [11520 - 24, 14400)
    assert (train.first_row, len(train)) == (0, 8640 - 24 - 6 + 1)
    assert (val.first_row, len(val)) == (8640 - 24, 11520 - (8640 - 24) - 24 - 6 + 1)
    assert (test.first_row, len(test)) == (11520 - 24, 14400 - (11520 - 24) - 24 - 6 + 1)

    # Scaler from rows 0..8639 only: column k is (k+1) * i, mean (k+1) * 4319.5,
    # population std (k+1) * sqrt((8640^2 - 1) / 12).
    std0 = np.sqrt((8640**2 - 1) / 12)
    np.testing.assert_allclose(dm.mean, [4319.5, 2 * 4319.5])
    np.testing.assert_allclose(dm.std, [std0, 2 * std0])

    # The first test window: encoder rows 11496..11519, decoder rows 11508..11525.
    item = test[0]
    rows = np.arange(11496, 11520)
    np.testing.assert_allclose(item["x"][:, 0].numpy(), (rows - 4319.5) / std0, rtol=1e-6)
    np.testing.assert_allclose(item["y"][:, 1].numpy(), (np.arange(11508, 11526) * 2 - 2 * 4319.5) / (2 * std0), rtol=1e-6)
    assert int(item["start"]) == 11520
    assert item["x"].shape == (24, 2) and item["y"].shape == (18, 2)
    assert item["x_mark"].shape == (24, 5) and item["y_mark"].shape == (18, 5)


def test_ettm_split_from_the_time_step(tmp_path):
    path = write_csv(tmp_path / "m.csv", 57_600, "15min")
    dm = setup(config(tmp_path, path, seq_len=16, label_len=8, pred_len=4))
    assert dm.freq == "15min"
    assert dm.datasets["val"].first_row == 4 * 8640 - 16
    assert dm.datasets["test"].first_row == 4 * 11520 - 16
    assert len(dm.datasets["test"]) == 4 * 14400 - (4 * 11520 - 16) - 16 - 4 + 1


@pytest.mark.parametrize("freq", ["D", "h"])  # daily, and hourly but too short for the ETTh split
def test_other_files_split_70_10_20(tmp_path, freq):
    path = write_csv(tmp_path / "d.csv", 200, freq)
    dm = setup(config(tmp_path, path, seq_len=8, label_len=4, pred_len=2))
    assert [dm.datasets[s].first_row for s in ("train", "val", "test")] == [0, 140 - 8, 160 - 8]
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [140 - 9, 28 - 9, 48 - 9]
    np.testing.assert_allclose(dm.mean, [69.5, 139.0])  # rows 0..139 only


def test_split_from_an_explicit_frequency():
    # data.freq names the step in any pandas spelling; calendar frequencies get 70/10/20
    assert split_borders(14_400, "60min", 10)["test"] == (11520 - 10, 14400)
    assert split_borders(14_400, "MS", 10)["test"] == (14400 - 2880 - 10, 14400)


def test_time_features_by_hand():
    dates = pd.DatetimeIndex(["2016-07-01 00:00", "2017-02-28 13:45", "2020-12-31 23:59"])
    # 2016-07-01 was a Friday (4), 2017-02-28 a Tuesday (1), 2020-12-31 a Thursday (3)
    expected = [[6, 0, 4, 0, 0], [1, 27, 1, 13, 45], [11, 30, 3, 23, 59]]
    np.testing.assert_array_equal(time_features(dates), expected)


def test_modes_put_the_target_last(tmp_path):
    path = write_csv(tmp_path / "c.csv", 200, "D", columns=("OT", "b", "c"))
    for mode, inputs, outputs in (("S", ["OT"], 1), ("M", ["b", "c", "OT"], 3), ("MS", ["b", "c", "OT"], 1)):
        dm = setup(config(tmp_path, path, seq_len=8, label_len=4, pred_len=2, mode=mode))
        assert (dm.columns, dm.n_inputs, dm.n_outputs) == (inputs, len(inputs), outputs)
        np.testing.assert_allclose(dm.raw[:3, -1], [0, 1, 2])  # the target column OT = row index


def test_default_series_written_once_and_read_back(tmp_path):
    state = np.random.get_state()
    dm = setup(config(tmp_path))
    assert np.array_equal(np.random.get_state()[1], state[1])  # gluonts' seeding is undone
    path = dm.data_path()
    assert dm.path == path and path.is_file() and path.is_relative_to(cache_root())  # the cache, not the run folder
    series = read_series_csv(path)
    assert len(series.dates) == 14_400 and series.columns[-1] == "OT" and dm.freq == "h"
    assert np.isfinite(series.values).all() and series.values.std(axis=0).min() > 0.5
    assert dm.datasets["test"].first_row == 11520 - 96  # the ETTh split
    again = tmp_path / "again.csv"
    write_default_csv(again)
    assert again.read_bytes() == path.read_bytes()  # deterministic, whatever the run's seed


def test_default_series_drifts_between_the_splits(tmp_path, monkeypatch):
    """The README's claim: the embedded default's later months have a level and scale the
    training months never show. Checked on the file with numpy and the ETTh borders
    written out here, and the drift itself against the undrifted series rebuilt by hand."""
    drifted = tmp_path / "drifted.csv"
    write_default_csv(drifted)
    values = pd.read_csv(drifted).drop(columns="date").to_numpy()  # [14400, 7]
    train, val, test = values[:8640], values[8640:11520], values[11520:14400]
    mean, std = train.mean(axis=0), train.std(axis=0)
    for later, min_scale, min_level in ((val, 1.1, 0.4), (test, 1.2, 0.6)):
        assert (later.std(axis=0) / std > min_scale).all()  # every channel swings wider
        assert (np.abs(later.mean(axis=0) - mean) / std > min_level).all()  # and sits elsewhere

    # The same recipe and seed without drift: each channel's deviations from its mean,
    # scaled by 1 + (1.6 - 1) * t, plus a level of +-1.5 of its std times t, t = 0 .. 1.
    monkeypatch.setattr(tsf.data, "DRIFT_SCALE", 1.0)
    monkeypatch.setattr(tsf.data, "DRIFT_LEVEL", 0.0)
    plain = tmp_path / "plain.csv"
    write_default_csv(plain)
    base = pd.read_csv(plain).drop(columns="date").to_numpy()
    t = np.linspace(0.0, 1.0, len(base))[:, None]
    centred = base - base.mean(axis=0)
    shift = values - (base.mean(axis=0) + centred * (1 + 0.6 * t))  # the level part alone, [rows, 7]
    level = shift[-1] / base.std(axis=0)
    np.testing.assert_allclose(np.abs(level), 1.5, atol=1e-3)
    np.testing.assert_allclose(shift, t * shift[-1], atol=2e-4)  # 4-decimal rounding of both files
    # Without drift the splits are alike: the checks above would fail on this series.
    b_train, b_test = base[:8640], base[11520:14400]
    assert (b_test.std(axis=0) / b_train.std(axis=0) < 1.1).all()


def test_train_batches_follow_the_step(tmp_path):
    path = write_csv(tmp_path / "d.csv", 200, "D")
    dm = setup(config(tmp_path, path, seq_len=8, label_len=4, pred_len=2))
    first = [b["start"].tolist() for _, b in zip(range(3), dm.train_dataloader())]
    assert len(set(map(tuple, first))) == 3
    assert all(len(b) == 32 for b in first)


# --- bad input: each a ConfigError / DataError with a one-line message naming the problem


def error_of(tmp_path, path, **data) -> str:
    with pytest.raises(ConfigError) as info:
        setup(config(tmp_path, path, **data))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_no_date_column(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("time,OT\n2016-07-01,1\n")
    message = error_of(tmp_path, path)
    assert str(path) in message and "no 'date' column" in message and "time, OT" in message


def test_unknown_target(tmp_path):
    path = write_csv(tmp_path / "d.csv", 200, "D")
    message = error_of(tmp_path, path, target="price")
    assert "data.target='price'" in message and "a, OT" in message


@pytest.mark.parametrize("cell, shown", [("abc", "'abc'"), ("", "''")])
def test_non_numeric_cell_names_line_and_column(tmp_path, cell, shown):
    path = write_csv(tmp_path / "d.csv", 200, "D")
    lines = path.read_text().splitlines()
    date, a, _ = lines[7].split(",")  # file line 8 (the header is line 1)
    lines[7] = f"{date},{a},{cell}"
    path.write_text("\n".join(lines) + "\n")
    message = error_of(tmp_path, path)
    assert f"line 8, column 'OT': {shown} is not a number" in message


def test_bad_and_unordered_dates(tmp_path):
    path = write_csv(tmp_path / "d.csv", 200, "D")
    lines = path.read_text().splitlines()
    lines[4] = "yesterday" + lines[4][lines[4].index(","):]
    path.write_text("\n".join(lines) + "\n")
    assert "line 5, column 'date': 'yesterday' is not a date" in error_of(tmp_path, path)

    lines = write_csv(path, 200, "D").read_text().splitlines()
    lines[5], lines[6] = lines[6], lines[5]
    path.write_text("\n".join(lines) + "\n")
    assert "line 7, column 'date'" in error_of(tmp_path, path)


def test_split_shorter_than_a_window(tmp_path):
    path = write_csv(tmp_path / "d.csv", 100, "D")  # val: rows [70 - 40, 80) = 50 rows < 40 + 20
    message = error_of(tmp_path, path, seq_len=40, label_len=10, pred_len=20)
    assert "the val split has 50 rows" in message and "data.seq_len + data.pred_len = 60" in message


def test_check_config_errors(tmp_path):
    cases = {
        "data.label_len=100": "data.label_len=100: must be in [0, data.seq_len=96]",
        "data.mode=X": "data.mode='X': must be one of S, M, MS",
        "data.freq=every-now-and-then": "data.freq='every-now-and-then'",
        "model.calendar=[hour,season]": "model.calendar=['hour', 'season']: must be a list of distinct names of month, "
                                        "day, weekday, hour, minute",
        "model.calendar=[hour,hour]": "model.calendar=['hour', 'hour']: must be a list of distinct names",
    }
    for arg, expected in cases.items():
        with pytest.raises(ConfigError) as info:
            tsf.check_config(compose(["task=tsf", arg]))
        assert expected in str(info.value)


def test_local_attention_needs_another_cross_attention():
    # The decoder's cross-attention (NC) is a pattern `local` lacks: the config check says
    # which key to set, and the task runs once model.cross_attention names another.
    with pytest.raises(ConfigError, match="noncausal cross-attention .*set model.cross_attention"):
        validate(compose(["task=tsf", "attention=local"]))
    with pytest.raises(ConfigError, match="'local' does not support noncausal cross-attention"):
        validate(compose(["task=tsf", "model.cross_attention=local"]))
    validate(compose(["task=tsf", "attention=local", "model.cross_attention=softmax"]))
