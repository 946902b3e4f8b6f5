"""Small PCN layouts written by the tests themselves (no third-party data), for the pcc
tests (tests/tasks/pcc/) and the pcc row of tests/core/test_ddp_metrics.py.

Importing it imports open3d (through the pcc task's PCD writer)."""

import json
from pathlib import Path

import numpy as np

from lavo_tasks.tasks.pcc.pcn import write_pcd

VIEW_OFFSET = 10.0  # partial view v of a model is its cloud shifted by v * VIEW_OFFSET along x


def cloud(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, size=(n, 3)).astype(np.float32)


def write_layout(root: Path, categories: dict, views: dict | None = None, points: int = 40) -> Path:
    """A PCN layout under `root`: categories = {synset: (name, {split: [models]})}; views
    = partial views per split (default 8 in train, 1 else). Each model's complete cloud
    has `points` points; its view v is the cloud's first half shifted by v * VIEW_OFFSET."""
    views = views or {"train": 8, "val": 1, "test": 1}
    entries = []
    for k, (synset, (name, splits)) in enumerate(categories.items()):
        entries.append({"taxonomy_id": synset, "taxonomy_name": name, **splits})
        for split, models in splits.items():
            for m, model in enumerate(models):
                base = cloud(points, seed=100 * k + m)
                write_pcd(root / split / "complete" / synset / f"{model}.pcd", base)
                for v in range(views[split]):
                    write_pcd(root / split / "partial" / synset / model / f"{v:02d}.pcd",
                              base[: points // 2] + np.array([v * VIEW_OFFSET, 0, 0], dtype=np.float32))
    (root / "PCN.json").write_text(json.dumps(entries))
    return root


SMALL = {"02691156": ("airplane", {"train": ["a0", "a1"], "val": ["a2"], "test": ["a3", "a4"]}),
         "02958343": ("car", {"train": ["c0"], "val": ["c1"], "test": ["c2"]})}
