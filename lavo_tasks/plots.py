"""Pieces every task's plots share: a title that says which attention and what result,
y limits that keep a tiny change looking tiny, the training loss curve.

Figures are made with `matplotlib.figure.Figure` (not pyplot), so no global backend
state is touched and nothing needs a display.
"""

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from omegaconf import DictConfig

from .files import write_atomically
from .provenance import RUNTIME_KEYS, run_attention


def attention_label(cfg: DictConfig) -> str:
    """The attention of the run, e.g. `lavo(window=32, rank=16, basis=learned,
    cross_segments=1)`, or one such entry per site when the sites differ."""
    described = {site: _describe(a) for site, a in run_attention(cfg).items()}
    if len(set(described.values())) == 1:
        return next(iter(described.values()))
    return ", ".join(f"{site.removesuffix('_attention')} {text}" for site, text in described.items())


def _describe(attention: dict) -> str:
    keys = [f"{k}={v}" for k, v in attention.items() if k != "name" and k not in RUNTIME_KEYS]
    return f"{attention['name']}({', '.join(keys)})" if keys else attention["name"]


def set_suptitle(fig: Figure, text: str, fontsize: float = 9) -> None:
    """`text` as the figure's title, each line wrapped at spaces to the figure's width (an
    attention label per site runs longer than a small figure)."""
    width = max(int(fig.get_figwidth() * 72 / (fontsize * 0.6)), 20)  # characters of ~0.6 em per line
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")), fontsize=fontsize)


def format_metrics(metrics: dict[str, float], names: Sequence[str]) -> str:
    """`name value` for those of `names` present, e.g. `test_mse 0.3585, test_mae 0.41`."""
    return ", ".join(f"{name} {metrics[name]:.4g}" for name in names if name in metrics)


def readable_ylim(ax, values: Sequence[float], min_relative_span: float = 0.1) -> None:
    """Set y limits that show every value with some margin and span at least
    `min_relative_span` of the values' mid-point: matplotlib's autoscale would stretch a
    change of 0.02 around 3.1 to the full height of the axis, where it reads as a slope.
    Non-finite values (a metric a run could not compute) are left to matplotlib."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return
    low, high = min(values), max(values)
    mid = (low + high) / 2
    half = max((high - low) / 2 * 1.15, abs(mid) * min_relative_span / 2, 1e-12)
    ax.set_ylim(mid - half, mid + half)


def plot_loss_curve(rows: list[dict], path: Path, title: str) -> None:
    """The training log's `train_loss` (every logged step) and `val_loss` (each
    validation) against the step, written to `path` (PNG)."""
    train = [(row["step"], row["train_loss"]) for row in rows if row.get("train_loss") is not None]
    val = [(row["step"], row["val_loss"]) for row in rows if row.get("val_loss") is not None]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train), color="tab:blue", linewidth=1, label="train_loss")
    if val:
        ax.plot(*zip(*val), color="tab:red", marker="o", label="val_loss")
        step, loss = val[-1]
        best_step, best = min(val, key=lambda point: point[1])
        title += f"\nval_loss {loss:.4g} at step {step}, best {best:.4g} at step {best_step}"
    ax.set(xlabel="step", ylabel="loss")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig: Figure, path: Path, dpi: int = 100) -> None:
    """Write `fig` as a PNG at `path`, atomically (its folder is made if missing).

    `fig.tight_layout()` leaves a placeholder layout engine on the figure, and savefig
    draws a figure that has any engine once without rendering before the real draw; the
    layout is already fixed, so that draw is dropped (the PNG is the same, byte for byte,
    without it)."""
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
