"""The PCN-layout reader on small layouts the tests write: PCD round trip, splits, view
sampling, resampling, categories, and every bad input as a one-line error."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.config import compose, validate
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.tasks.pcc.data import PCNDataModule, resample
from lavo_tasks.tasks.pcc.pcn import pcd_point_count, read_pcd, write_pcd

from pcn_layout import SMALL, VIEW_OFFSET, cloud, write_layout


def config(root: Path, *args: str):
    cfg = compose(["task=pcc", f"data.path={root}", f"run.dir={root.parent / 'run'}", "data.n_input=16",
                   "data.n_gt=32", "model.n_proxies=8", "model.n_neighbors=4", *args])
    OmegaConf.set_struct(cfg, False)
    return cfg


def datamodule(root: Path, *args: str) -> PCNDataModule:
    dm = PCNDataModule(config(root, *args))
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_pcd_round_trip(tmp_path):
    points = cloud(100, seed=0)
    write_pcd(tmp_path / "a.pcd", points)
    assert np.array_equal(read_pcd(tmp_path / "a.pcd"), points)  # float32 fields: exact
    assert pcd_point_count(tmp_path / "a.pcd") == 100
    assert [p.name for p in tmp_path.iterdir()] == ["a.pcd"]  # no temporary file left


def test_splits_categories_and_spec(tmp_path):
    dm = datamodule(write_layout(tmp_path / "pcn", SMALL))
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 3, "val": 2, "test": 3}
    assert dm.spec() == {"categories": ["airplane", "car"], "synsets": ["02691156", "02958343"]}
    assert [s.model for s in dm.datasets["test"].samples] == ["a3", "a4", "c2"]
    assert dm.datasets["test"][2]["category"].item() == 1
    by_name = datamodule(tmp_path / "pcn", "data.categories=[car]")
    by_id = datamodule(tmp_path / "pcn", "data.categories=['02958343']")
    for dm in (by_name, by_id):
        assert [s.model for s in dm.datasets["train"].samples] == ["c0"]
        assert dm.spec()["categories"] == ["car"]


def test_train_draws_every_view_and_evaluation_view_00(tmp_path):
    dm = datamodule(write_layout(tmp_path / "pcn", SMALL))
    torch.manual_seed(0)
    seen = {round(float(dm.datasets["train"][0]["partial"][:, 0].mean()) / VIEW_OFFSET) for _ in range(80)}
    assert seen == set(range(8))
    for split in ("val", "test"):
        for i in range(len(dm.datasets[split])):
            assert dm.datasets[split][i]["partial"][:, 0].max() < VIEW_OFFSET / 2  # view 00: not shifted
    # evaluation resamples the same points every time
    assert torch.equal(dm.datasets["test"][1]["partial"], dm.datasets["test"][1]["partial"])


def test_resampling_sizes(tmp_path):
    points = cloud(40, seed=1)
    fewer = resample(points, 16, torch.Generator().manual_seed(0))
    assert fewer.shape == (16, 3) and len(torch.unique(fewer, dim=0)) == 16
    assert all((torch.from_numpy(points) == p).all(1).any() for p in fewer)  # a subset of the file's points
    more = resample(points, 100, torch.Generator().manual_seed(0))
    assert more.shape == (100, 3)
    assert torch.equal(torch.unique(more, dim=0), torch.unique(torch.from_numpy(points), dim=0))  # all, repeated
    dm = datamodule(write_layout(tmp_path / "pcn", SMALL), "data.n_gt_eval=24")
    item = dm.datasets["train"][0]
    assert item["partial"].shape == (16, 3) and item["complete"].shape == (32, 3)
    for split in ("val", "test"):  # scored against data.n_gt_eval true points, not the training target's
        assert dm.datasets[split][0]["complete"].shape == (24, 3)


def test_missing_complete_file(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    missing = root / "val" / "complete" / "02958343" / "c1.pcd"
    missing.unlink()
    with pytest.raises(DataError, match=f"{missing}: no such file"):
        datamodule(root)


def test_model_without_partial_views(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    for view in (root / "train" / "partial" / "02691156" / "a1").iterdir():
        view.unlink()
    with pytest.raises(DataError, match="a1: model a1 has no partial views"):
        datamodule(root)


def test_empty_and_unreadable_clouds(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    empty = root / "test" / "partial" / "02958343" / "c2" / "00.pcd"
    empty.write_text("# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
                     "WIDTH 0\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 0\nDATA ascii\n")
    with pytest.raises(DataError, match=f"{empty}: an empty cloud"):
        datamodule(root)
    empty.write_bytes(b"\x00\x01 not a point cloud")
    with pytest.raises(DataError, match=f"{empty}: not a PCD file"):
        datamodule(root)
    # a header that promises points the file does not hold: caught when read
    write_pcd(empty, cloud(5, seed=2))
    text = empty.read_bytes()
    empty.write_bytes(text[: text.index(b"DATA binary\n") + len(b"DATA binary\n")])
    with pytest.raises(DataError, match=f"{empty}: no points read"):
        read_pcd(empty)


def test_taxonomy_naming_missing_folders(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    entries = json.loads((root / "PCN.json").read_text())
    entries.append({"taxonomy_id": "03001627", "taxonomy_name": "chair", "train": ["x"], "val": [], "test": []})
    (root / "PCN.json").write_text(json.dumps(entries))
    with pytest.raises(DataError, match="train/complete/03001627: no such folder; .* lists 1 train models"):
        datamodule(root)
    other = write_layout(tmp_path / "other", SMALL)
    for path in sorted((other / "val").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (other / "val").rmdir()
    with pytest.raises(DataError, match="val/complete/02691156: no such folder"):
        datamodule(other)
    (root / "PCN.json").write_text("{not json")
    with pytest.raises(DataError, match="PCN.json: not valid JSON"):
        datamodule(root)
    with pytest.raises(DataError, match="PCN.json: no such file"):
        datamodule(tmp_path)


def test_unknown_category(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    with pytest.raises(ConfigError, match="data.categories: 'boat' is not a category .* 02691156 \\(airplane\\)"):
        datamodule(root, "data.categories=[boat]")


@pytest.mark.parametrize("args, message", [
    (["data.n_input=32", "model.n_proxies=64"], "data.n_input=32: must be >= model.n_proxies=64"),
    (["data.n_input=32", "model.n_proxies=8", "model.n_neighbors=33"], "model.n_neighbors=33: must be in \\[1, data.n_input=32\\]"),
    (["model.fold_points=0"], "model.fold_points=0: must be >= 1"),
    (["model.n_queries=0"], "model.n_queries=0: must be >= 1"),
])
def test_bad_sizes(args, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(["task=pcc", *args]))


def test_cli_reports_bad_data_in_one_line_before_training(tmp_path):
    root = write_layout(tmp_path / "pcn", SMALL)
    (root / "test" / "complete" / "02691156" / "a4.pcd").unlink()
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.train", "task=pcc", f"data.path={root}",
                             f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]  # Lightning prints its device lines first
    assert errors == [f"error: {root}/test/complete/02691156/a4.pcd: no such file"] == result.stderr.strip().splitlines()[-1:]
    assert not (tmp_path / "run" / "config.yaml").exists()
