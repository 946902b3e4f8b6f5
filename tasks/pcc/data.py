"""Data for point cloud completion: the PCN layout (pcn.py) -> training and evaluation items.

- A training item is a model with one of its partial views drawn at random each time
  the model is drawn; validation and test items use view `00`.
- The partial cloud is resampled to `data.n_input` points and the complete one to
  `data.n_gt` in train (the training target) and to `data.n_gt_eval` in val and test
  (the truth the metrics score against; the F-score's 0.01 threshold means something only
  where the truth is dense enough that a point on the surface lies within 0.01 of a true
  point, as with PCN's 16,384 points): a random subset when the file has more points, all of them plus random
  repeats when it has fewer (PoinTr pads with zeros instead; repeats add no point that
  is not on the object). Training draws from torch's global generator (seeded per step
  by the module, and per worker by Lightning); validation and test resample with a
  generator seeded by the item, so every evaluation sees the same points.
- No normalisation is applied: PCN's clouds are already in each object's canonical frame
  (ShapeNet's normalised models: centred, about unit size), the partial views in the
  same frame as the complete cloud, which is what the absolute F-score threshold 0.01
  assumes. Data in another frame must be brought to that scale before use.

Every file is checked before training: that it exists and that its PCD header names
x y z fields and at least one point (the header only, so a large dataset is checked
without reading its points); a file open3d cannot read fails with its path when read.
The embedded default (`data.path: ""`, see shapes.py) is written in this layout and read
by this reader.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from ...data import TaskDataModule
from ...errors import ConfigError, DataError
from . import shapes
from .pcn import SPLITS, TAXONOMY_FILE, pcd_point_count, read_pcd, read_taxonomy


@dataclass(frozen=True)
class Category:
    synset: str   # the taxonomy id, the folder name
    name: str     # the taxonomy name


@dataclass(frozen=True)
class Sample:
    category: int            # index into the dataset's categories
    model: str
    complete: Path
    partials: tuple[Path, ...]  # the views in name order (00, 01, ...)


def select_categories(entries: list[dict], wanted: list[str], root: Path) -> list[dict]:
    """The entries whose taxonomy id or name is in `wanted` (all when empty)."""
    if not wanted:
        return entries
    known = {e["taxonomy_id"]: e for e in entries} | {e.get("taxonomy_name", ""): e for e in entries}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        allowed = ", ".join(f"{e['taxonomy_id']} ({e.get('taxonomy_name', '')})" for e in entries)
        raise ConfigError(f"data.categories: {unknown[0]!r} is not a category of {root / TAXONOMY_FILE}; "
                          f"it has {allowed}")
    chosen = {known[w]["taxonomy_id"] for w in wanted}
    return [e for e in entries if e["taxonomy_id"] in chosen]


def index_split(root: Path, entries: list[dict], split: str) -> list[Sample]:
    """The samples of one split, with every file's header checked (module docstring)."""
    samples = []
    for c, entry in enumerate(entries):
        models, synset = entry.get(split, []), entry["taxonomy_id"]
        if not models:
            continue
        for kind in ("complete", "partial"):
            folder = root / split / kind / synset
            if not folder.is_dir():
                raise DataError(f"{folder}: no such folder; {root / TAXONOMY_FILE} lists {len(models)} {split} "
                                f"models of {synset}")
        for model in tqdm(models, desc=f"checking {split}/{synset}", leave=False, disable=len(models) < 500):
            complete = root / split / "complete" / synset / f"{model}.pcd"
            view_folder = root / split / "partial" / synset / model
            views = tuple(sorted(view_folder.glob("[0-9][0-9].pcd"))) if view_folder.is_dir() else ()
            if not views:
                raise DataError(f"{view_folder}: model {model} has no partial views (NN.pcd files)")
            for path in (complete, *views):
                pcd_point_count(path)
            samples.append(Sample(c, model, complete, views))
    if not samples:
        raise DataError(f"{root / TAXONOMY_FILE}: no {split} models in the chosen categories")
    return samples


def resample(points: np.ndarray, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[n, 3] float32: a random subset of points [N, 3] when N >= n (the points as they
    are when N == n), all N plus n - N random repeats when N < n."""
    count = len(points)
    if count == n:
        index = torch.arange(n)
    elif count > n:
        index = torch.randperm(count, generator=generator)[:n]
    else:
        index = torch.cat([torch.arange(count), torch.randint(count, (n - count,), generator=generator)])
    return torch.from_numpy(points)[index]


class CompletionDataset(Dataset):
    """Item: `partial` [n_input, 3], `complete` [n_gt, 3], `category` (an index) and
    `index` (of the sample in the split). n_gt is the split's: data.n_gt in train,
    data.n_gt_eval in val and test."""

    def __init__(self, samples: list[Sample], n_input: int, n_gt: int, train: bool):
        self.samples, self.n_input, self.n_gt, self.train = samples, n_input, n_gt, train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = self.samples[i]
        fixed = torch.Generator().manual_seed(i)
        if self.train:
            view = sample.partials[int(torch.randint(len(sample.partials), ()))]
            partial = resample(read_pcd(view), self.n_input)
        else:
            partial = resample(read_pcd(sample.partials[0]), self.n_input, fixed)
        return {
            "partial": partial,
            "complete": resample(read_pcd(sample.complete), self.n_gt, fixed),
            "category": torch.tensor(sample.category),
            "index": torch.tensor(i),
        }


class PCNDataModule(TaskDataModule):
    """Indexes and checks the PCN layout (or builds the embedded default) in `setup`;
    `self.datasets[split]`, `self.categories`. Validation reads the split in a fixed
    shuffled order, so that `trainer.limit_val_batches` takes every category."""

    val_order_seed = 0
    default_name = "primitives"

    def default_recipe(self) -> dict:
        return shapes.recipe()

    def write_default(self, path: Path) -> None:
        shapes.write_default_dataset(path)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.root = self.data_path()
        if not self.root.is_dir():
            raise DataError(f"{self.root}: no such folder")
        data = self.cfg.data
        entries = select_categories(read_taxonomy(self.root), list(data.categories), self.root)
        self.categories = [Category(e["taxonomy_id"], e.get("taxonomy_name") or e["taxonomy_id"]) for e in entries]
        for split in SPLITS:
            samples = index_split(self.root, entries, split)
            train = split == "train"
            self.datasets[split] = CompletionDataset(samples, data.n_input, data.n_gt if train else data.n_gt_eval,
                                                     train=train)

    def spec(self) -> dict:
        """What the model and its metrics need: the categories' names, in index order.
        Reads the layout first (building the default), so bad data fails before training."""
        self.prepare_data()
        self.setup("fit")
        return {"categories": [c.name for c in self.categories], "synsets": [c.synset for c in self.categories]}
