"""Data for long sequence time-series forecasting: the ETT / Informer CSV layout.

A file has a `date` column and numeric columns, one row per time step (ETTh1.csv:
`date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT`). It is cut into train / validation / test
rows as Informer does:

- hourly files with at least 14,400 rows (ETTh): 12 / 4 / 4 months of 30 days,
  rows [0, 8640), [8640 - L, 11520), [11520 - L, 14400), L = data.seq_len (the
  validation and test slices start L rows early so that their first window has a full
  look-back); rows after 14,400 are not used, as in Informer;
- 15-minute files with at least 57,600 rows (ETTm): the same months, 4 rows an hour;
- any other file: 70 / 10 / 20 % of the rows, with the same look-back overlap.

Values are z-scored with the mean and (population) standard deviation of the training
rows only. A window starting at row i of a slice gives the encoder rows [i, i + L) and
the decoder rows [i + L - label_len, i + L + pred_len): `label_len` known steps and
`pred_len` steps to forecast. Every window of a slice is used (stride 1).

The embedded default (`data.path: ""`) is a 14,400-row hourly series made with
`gluonts.dataset.artificial` and written once per machine to `synthetic_hourly.csv` in the
default-data cache (lavo_tasks.default_data);
the same reader loads it, and its length gives it the ETTh split. Like the ETT series,
it drifts in level and scale between the splits (see write_default_csv).
"""

import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from gluonts.time_feature import get_seasonality
from torch.utils.data import Dataset

from ...data import TaskDataModule
from ...errors import ConfigError, DataError
from ...files import write_atomically
from .metrics import seasonal_errors

MODES = ("S", "M", "MS")
SPLITS = ("train", "val", "test")
# The columns of time_features(), 0-based, and how many values each takes.
TIME_FEATURES = {"month": 12, "day": 31, "weekday": 7, "hour": 24, "minute": 60}

ETT_MONTH_ROWS = 30 * 24  # an ETTh "month": 30 days of hourly rows
ETT_LAYOUTS = {pd.Timedelta("1h"): 1, pd.Timedelta("15min"): 4}  # time step -> rows per hour

DEFAULT_FILE = "synthetic_hourly.csv"
DEFAULT_VERSION = 1  # of write_default_csv's output: raise it when the series it writes changes
DEFAULT_ROWS = 14_400  # exactly the ETTh 12/4/4-month split
DEFAULT_DATA_SEED = 2016  # the default series is the same for every run, whatever `seed`
DRIFT_SCALE, DRIFT_LEVEL = 1.6, 1.5  # the default series' drift by its last row (write_default_csv)
VAL_ORDER_SEED = 0  # the validation sample (trainer.limit_val_batches) too


@dataclass
class Series:
    """A CSV file read and checked: `values` [rows, columns] float64 in file order."""

    path: Path
    dates: pd.DatetimeIndex
    columns: list[str]
    values: np.ndarray


def read_series_csv(path: Path) -> Series:
    """Read a `date` + numeric columns CSV; DataError naming the file, line and column
    of the first problem (line numbers count the header as line 1)."""
    if path.is_dir():
        raise DataError(f"data.path={str(path)!r}: a folder; task tsf reads one CSV file (a `date` column, "
                        "then numeric columns)")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable CSV file ({str(err).splitlines()[0]})") from None
    if "date" not in frame.columns:
        raise DataError(f"{path}: no 'date' column; the header has {', '.join(map(str, frame.columns))}")
    columns = [c for c in frame.columns if c != "date"]
    if not columns:
        raise DataError(f"{path}: no value columns besides 'date'")
    if len(frame) < 2:
        raise DataError(f"{path}: {len(frame)} data row{'s' * (len(frame) != 1)} after the header; a series needs "
                        "at least two to tell its frequency")

    dates = pd.to_datetime(frame["date"], errors="coerce")
    if dates.isna().any():
        row = int(np.flatnonzero(dates.isna().to_numpy())[0])
        raise DataError(f"{path}: line {row + 2}, column 'date': {frame['date'][row]!r} is not a date")
    steps = np.diff(dates.to_numpy()).astype(np.int64)
    if (steps <= 0).any():
        row = int(np.flatnonzero(steps <= 0)[0]) + 1
        raise DataError(f"{path}: line {row + 2}, column 'date': {frame['date'][row]} does not come after the line before")

    values = np.empty((len(frame), len(columns)), dtype=np.float64)
    for j, name in enumerate(columns):
        numbers = pd.to_numeric(frame[name], errors="coerce")
        bad = numbers.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: line {row + 2}, column {name!r}: {frame[name][row]!r} is not a number")
        values[:, j] = numbers.to_numpy()
    return Series(path, pd.DatetimeIndex(dates), columns, values)


def infer_freq(dates: pd.DatetimeIndex) -> str:
    """The most common step between consecutive dates, as a pandas offset alias ("h", "15min")."""
    if len(dates) < 2:
        raise DataError("the series needs at least two rows to tell its frequency")
    steps = pd.Series(np.diff(dates.to_numpy()))
    return pd.tseries.frequencies.to_offset(pd.Timedelta(steps.mode().iloc[0])).freqstr


def split_borders(n_rows: int, freq: str, seq_len: int) -> dict[str, tuple[int, int]]:
    """Row ranges [start, end) of the train / val / test slices (see the module docstring)."""
    offset = pd.tseries.frequencies.to_offset(freq)
    try:
        per_hour = ETT_LAYOUTS.get(pd.Timedelta(offset))
    except ValueError:  # a calendar frequency (months, ...) has no fixed step
        per_hour = None
    if per_hour is not None and n_rows >= 20 * ETT_MONTH_ROWS * per_hour:
        month = ETT_MONTH_ROWS * per_hour
        train_end, val_end, test_end = 12 * month, 16 * month, 20 * month
    else:
        train_end = int(n_rows * 0.7)
        test_rows = int(n_rows * 0.2)
        val_end, test_end = n_rows - test_rows, n_rows
    return {
        "train": (0, train_end),
        "val": (max(train_end - seq_len, 0), val_end),
        "test": (max(val_end - seq_len, 0), test_end),
    }


def time_features(dates: pd.DatetimeIndex) -> np.ndarray:
    """[rows, 5] int64: month 0..11, day of month 0..30, weekday 0..6 (Monday 0), hour, minute."""
    return np.stack(
        [dates.month - 1, dates.day - 1, dates.weekday, dates.hour, dates.minute], axis=1
    ).astype(np.int64)


def write_default_csv(path: Path, rows: int = DEFAULT_ROWS, seed: int = DEFAULT_DATA_SEED) -> None:
    """Write the embedded default: hourly rows from 2016-07-01, six `load_*` channels and
    the target `OT`, in the ETT layout.

    Each load is a level plus daily and weekly seasonality (random phases), a slow linear
    trend, an AR(1) component and white noise; `OT` mixes the loads with its own lagged
    daily cycle and a slow AR(1) drift, so multivariate input helps to forecast it. The
    pieces are `gluonts.dataset.artificial.recipe` generators; gluonts seeds numpy's
    global generator, whose state is restored afterwards.

    Then every channel drifts as real ETT series do between the training months and the
    later ones: its deviations from its mean grow linearly in time to DRIFT_SCALE times
    at the last row, and its level moves by up to DRIFT_LEVEL of its standard deviations
    (a random sign per channel), so the validation and test months have a level and
    scale the training months never show.
    """
    with warnings.catch_warnings():  # gluonts suggests faster json packages on import
        warnings.simplefilter("ignore")
        from gluonts.dataset.artificial import recipe as rcp

    rng = np.random.default_rng(seed)
    loads = []
    for _ in range(6):
        loads.append(
            rng.uniform(8, 16)
            + rng.uniform(1, 4) * rcp.SmoothSeasonality(period=24, phase=float(rng.uniform(0, 24)))
            + rng.uniform(0.5, 2) * rcp.SmoothSeasonality(period=24 * 7, phase=float(rng.uniform(0, 168)))
            + rcp.LinearTrend(slope=float(rng.uniform(-0.5, 0.5)))
            + rcp.ARp(phi=[0.9], sigma=float(rng.uniform(0.1, 0.3)))
            + rcp.RandomGaussian(stddev=float(rng.uniform(0.05, 0.2)))
        )
    weights = rng.uniform(0.1, 0.4, size=len(loads))
    oil = (
        5.0
        + sum(float(w) * x for w, x in zip(weights, loads))
        + 3.0 * rcp.SmoothSeasonality(period=24, phase=6.0)
        + rcp.ARp(phi=[0.99], sigma=0.1)
        + rcp.RandomGaussian(stddev=0.1)
    )
    recipe = {**{f"load_{i + 1}": x for i, x in enumerate(loads)}, "OT": oil}

    start = pd.Period("2016-07-01 00:00", freq="h")
    numpy_state = np.random.get_state()
    try:
        with warnings.catch_warnings():  # gluonts warns that numba is missing (it only makes AR slower)
            warnings.simplefilter("ignore")
            entry = next(rcp.generate(rows, recipe, start, seed=seed))
    finally:
        np.random.set_state(numpy_state)

    frame = pd.DataFrame({"date": pd.date_range(start.to_timestamp(), periods=rows, freq="h")})
    progress = np.arange(rows) / (rows - 1)  # 0 at the first row, 1 at the last
    for name in recipe:
        values = np.asarray(entry[name], dtype=np.float64)
        mean, std = values.mean(), values.std()
        level = rng.choice([-1.0, 1.0]) * DRIFT_LEVEL * std
        frame[name] = mean + (values - mean) * (1 + (DRIFT_SCALE - 1) * progress) + level * progress
    path.parent.mkdir(parents=True, exist_ok=True)
    text = frame.to_csv(index=False, float_format="%.4f", date_format="%Y-%m-%d %H:%M:%S")
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))  # a reader never sees a half-written file


class WindowDataset(Dataset):
    """All windows of one slice. Item: `x` [seq_len, C] and `x_mark` [seq_len, 5] for the
    encoder, `y` [label_len + pred_len, C] and `y_mark` [label_len + pred_len, 5] for the
    decoder (its last pred_len rows are the truth to forecast), and `start`: the row of
    the whole file where the forecast begins.

    With `raw_outputs` ([rows of the slice, n_outputs], unscaled) and `seasonal_error`
    ([windows, n_outputs]), as the test split has, an item also holds what the unscaled
    metrics need: `y_raw` [pred_len, n_outputs] float64, the truth in the file's units,
    `seasonal_error` [n_outputs] float64 (gluonts' scale for MASE, from the whole history
    before the forecast) and `index`, the window's position in the slice."""

    def __init__(self, values: np.ndarray, marks: np.ndarray, first_row: int, seq_len: int, label_len: int,
                 pred_len: int, raw_outputs: np.ndarray | None = None, seasonal_error: np.ndarray | None = None):
        self.values = torch.as_tensor(values, dtype=torch.float32)
        self.marks = torch.as_tensor(marks)
        self.first_row = first_row
        self.seq_len, self.label_len, self.pred_len = seq_len, label_len, pred_len
        self.raw_outputs = None if raw_outputs is None else torch.as_tensor(raw_outputs, dtype=torch.float64)
        self.seasonal_error = None if seasonal_error is None else torch.as_tensor(seasonal_error, dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.values) - self.seq_len - self.pred_len + 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        enc_end = i + self.seq_len
        dec = slice(enc_end - self.label_len, enc_end + self.pred_len)
        item = {
            "x": self.values[i:enc_end],
            "x_mark": self.marks[i:enc_end],
            "y": self.values[dec],
            "y_mark": self.marks[dec],
            "start": torch.tensor(self.first_row + enc_end),
        }
        if self.raw_outputs is not None:
            item |= {"y_raw": self.raw_outputs[enc_end : enc_end + self.pred_len],
                     "seasonal_error": self.seasonal_error[i], "index": torch.tensor(i)}
        return item


class TSFDataModule(TaskDataModule):
    """Reads the file (or writes the default), splits, scales; `setup` makes
    `self.datasets[split]` and the facts of the data: `columns` (the input channels;
    `n_inputs` of them), `n_outputs` (channels forecast, the last `n_outputs` inputs),
    `mean` / `std` of the input channels, `raw` [rows, n_inputs] the unscaled values of
    the whole file, `dates` of its rows, `freq`. `spec()` is what of it the model is built from."""

    val_order_seed = VAL_ORDER_SEED
    default_name = DEFAULT_FILE

    def default_recipe(self) -> dict:
        return {"builder": "tsf.write_default_csv", "version": DEFAULT_VERSION, "rows": DEFAULT_ROWS,
                "seed": DEFAULT_DATA_SEED, "drift_scale": DRIFT_SCALE, "drift_level": DRIFT_LEVEL,
                "gluonts": version("gluonts"), "numpy": np.__version__, "pandas": pd.__version__}

    def write_default(self, path: Path) -> None:
        write_default_csv(path)

    def spec(self) -> dict:
        """`columns`: the input channels in order (encoder and decoder read them all);
        `n_outputs`: how many are forecast, the last ones; `mean` / `std`: the scaler of
        every input channel, from the training rows."""
        self.prepare_data()
        self.setup("fit")
        return {"columns": list(self.columns), "n_outputs": self.n_outputs,
                "mean": self.mean.tolist(), "std": self.std.tolist()}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        data = self.cfg.data
        self.path = self.data_path()
        series = read_series_csv(self.path)
        if data.target not in series.columns:
            raise ConfigError(
                f"data.target={data.target!r}: no such column in {self.path}; its columns are {', '.join(series.columns)}"
            )
        # Informer's column order: the target last, so that MS forecasts the last channel.
        if data.mode == "S":
            columns = [data.target]
        else:
            columns = [c for c in series.columns if c != data.target] + [data.target]
        raw = series.values[:, [series.columns.index(c) for c in columns]]  # [rows, n_inputs]
        self.freq = data.freq or infer_freq(series.dates)
        borders = split_borders(len(raw), self.freq, data.seq_len)

        train = raw[slice(*borders["train"])]
        self.mean = train.mean(axis=0)
        std = train.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)  # a constant training channel is only centred
        scaled = (raw - self.mean) / self.std
        marks = time_features(series.dates)
        n_outputs = 1 if data.mode == "MS" else len(columns)
        outputs = raw[:, -n_outputs:]  # [rows, n_outputs] unscaled

        for split in SPLITS:
            start, end = borders[split]
            windows = end - start - data.seq_len - data.pred_len + 1
            if windows < 1:
                raise DataError(
                    f"{self.path}: the {split} split has {end - start} rows (rows {start}..{end - 1}), fewer than "
                    f"data.seq_len + data.pred_len = {data.seq_len + data.pred_len}"
                )
            extras = {}
            if split == "test":
                starts = start + data.seq_len + np.arange(windows)  # rows where the forecasts begin
                extras = {"raw_outputs": outputs[start:end],
                          "seasonal_error": seasonal_errors(outputs, starts, get_seasonality(self.freq))}
            self.datasets[split] = WindowDataset(
                scaled[start:end], marks[start:end], start, data.seq_len, data.label_len, data.pred_len, **extras
            )
        self.raw = raw  # [rows, n_inputs] unscaled, the whole file
        self.dates = series.dates
        self.columns = columns
        self.n_inputs, self.n_outputs = len(columns), n_outputs
