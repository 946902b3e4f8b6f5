"""completions.png carries the attention and the test figures (drawn from made-up clouds,
no training)."""

from types import SimpleNamespace

import numpy as np
from matplotlib.figure import Figure

from lavo_tasks.config import compose
from lavo_tasks.tasks.pcc.module import CompletionModule


def test_completions_are_titled_with_the_attention_and_the_test_figures(tmp_path, monkeypatch):
    titles = []
    real_savefig = Figure.savefig

    def record(fig, *args, **kwargs):
        titles.append((fig._suptitle.get_text(), [ax.get_title() for ax in fig.axes]))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    rng = np.random.default_rng(0)
    clouds = {kind: rng.normal(size=(n, 3)) for kind, n in (("partial", 16), ("predicted", 32), ("true", 48))}
    module = SimpleNamespace(cfg=compose(["task=pcc", "attention=gsa"]), artifacts_dir=tmp_path,
                             pictured=[{"category": "car", "name": "car_2", **clouds}])
    figures = {"test_cd_l1": 7.25, "test_cd_l2": 0.3, "test_fscore": 0.61, "test_cd_l1_car": 7.5,
               "test_partial_cd_l1": 12.0, "test_partial_cd_l2": 0.9, "test_partial_fscore": 0.4,
               "test_partial_cd_l1_car": 12.5}
    CompletionModule.draw_completions(module, figures)
    suptitle, panels = titles[0]
    assert suptitle.replace("\n", " ") == ("pcc, attention gsa(slots=64, tau=8.0) model: test_cd_l1 7.25, test_cd_l2 0.3, test_fscore 0.61 "
                        "partial input: test_partial_cd_l1 12, test_partial_cd_l2 0.9, test_partial_fscore 0.4")
    assert panels == ["car_2: partial (16 points)\ntest_partial_cd_l1_car 12.5",
                      "car_2: predicted (32 points)\ntest_cd_l1_car 7.5", "car_2: true (48 points)"]
    assert (tmp_path / "completions.png").stat().st_size > 0
