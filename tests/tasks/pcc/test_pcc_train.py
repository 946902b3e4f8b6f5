"""End-to-end runs of `task=pcc` with every attention on a tiny layout the test writes:
the metrics (the partial baseline recomputed independently), the pictures, the clouds."""

import json

import numpy as np
import pytest
import torch

from lavo_tasks import train
from lavo_tasks.config import compose
from lavo_tasks.tasks.pcc.data import PCNDataModule
from lavo_tasks.tasks.pcc.pcn import read_pcd

from pcn_layout import SMALL, write_layout
from tiny import ATTENTIONS, ENCODER_DECODER, attention_args

TINY = ["data.n_input=16", "data.n_gt=32", "data.n_gt_eval=48", "data.batch_size=2", *ENCODER_DECODER,
        "model.n_proxies=8", "model.n_neighbors=4", "model.n_queries=4", "model.fold_points=4", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "trainer.enable_progress_bar=false"]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_train_a_few_steps(tmp_path, attention):
    root = write_layout(tmp_path / "pcn", SMALL)
    args = ["task=pcc", f"attention={attention}", f"data.path={root}", f"run.dir={tmp_path / 'run'}", *TINY,
            *attention_args(attention, window=4, slots=8)]
    assert train.main(args) == 0
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    for name in ("cd_l1", "cd_l2", "fscore"):
        for prefix in ("test_", "test_partial_"):
            assert np.isfinite(metrics[prefix + name])
            assert {f"{prefix}{name}_airplane", f"{prefix}{name}_car"} <= set(metrics)
    assert 0 <= metrics["test_fscore"] <= 1

    # The baseline, recomputed with dense distances (torch.cdist) on the same test clouds.
    cfg = compose(["task=pcc", f"attention={attention}", f"data.path={root}", f"run.dir={tmp_path / 'other'}", *args[4:]])
    dm = PCNDataModule(cfg)
    dm.setup("test")
    values = []
    for i in range(len(dm.datasets["test"])):
        item = dm.datasets["test"][i]
        distances = torch.cdist(item["partial"].double(), item["complete"].double())
        d1, d2 = distances.min(1).values, distances.min(0).values
        values.append(float((d1.mean() + d2.mean()) / 2 * 1000))
    assert metrics["test_partial_cd_l1"] == pytest.approx(np.mean(values))
    assert metrics["test_partial_cd_l1_car"] == pytest.approx(values[-1])

    assert (run / "artifacts" / "completions.png").stat().st_size > 10_000
    clouds = sorted((run / "artifacts" / "predictions").glob("*.pcd"))
    assert [p.name for p in clouds] == ["airplane_0.pcd", "car_2.pcd"]  # the first test model of each category
    assert read_pcd(clouds[0]).shape == (4 * 4 + 16, 3)  # n_queries x fold_points + the input
