"""The task data-module base: its loaders and its default-data folder."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.data import TaskDataModule
from lavo_tasks.default_data import CACHE_ENV, cache_root


def config(path: str = "", run_dir: str = "run", batch_size: int = 4):
    return OmegaConf.create({"task": "demo", "seed": 3, "run": {"dir": run_dir},
                             "data": {"path": path, "batch_size": batch_size, "num_workers": 0}})


class Numbers(TaskDataModule):
    """Items are numbers read from the data file (the default: ten of them); `builds`
    records every default build."""

    default_name = "numbers.txt"
    builds: list[Path] = []

    def default_recipe(self) -> dict:
        return {"builder": "numbers", "version": 1}

    def write_default(self, path: Path) -> None:
        Numbers.builds.append(path)
        path.write_text("0 1 2 3 4 5 6 7 8 9\n")

    def setup(self, stage=None) -> None:
        n = len(self.data_path().read_text().split())
        self.datasets = {"train": torch.arange(n), "val": torch.arange(n) + 100, "test": torch.arange(n) + 200}


def test_training_batches_are_drawn_from_seed_and_step_and_resume_there():
    dm = Numbers(config())
    dm.setup()
    batches = iter(dm.train_dataloader())
    for step in range(3):
        # The seed rule by hand: generator seeded with seed * 1_000_003 + step, 4 draws of 10 items.
        expected = torch.randint(10, (4,), generator=torch.Generator().manual_seed(3 * 1_000_003 + step))
        assert torch.equal(next(batches), expected)
    dm.trainer = SimpleNamespace(global_step=2)  # a run resumed at step 2
    resumed = next(iter(dm.train_dataloader()))
    assert torch.equal(resumed, torch.randint(10, (4,), generator=torch.Generator().manual_seed(3 * 1_000_003 + 2)))


def test_evaluation_reads_every_item_once_in_order_or_in_one_fixed_shuffle():
    dm = Numbers(config())
    dm.setup()
    assert torch.cat(list(dm.val_dataloader())).tolist() == list(range(100, 110))
    assert torch.cat(list(dm.test_dataloader())).tolist() == list(range(200, 210))
    dm.val_order_seed = 5
    order = torch.randperm(10, generator=torch.Generator().manual_seed(5))
    shuffled = [torch.cat(list(dm.val_dataloader())).tolist() for _ in range(2)]
    assert shuffled[0] == shuffled[1] == (order + 100).tolist()


def test_loaders_collate_with_the_tasks_function():
    class Paired(Numbers):
        def collate_fn(self, fixed=False):
            return lambda items: {"items": torch.stack(items), "count": len(items)}

    dm = Paired(config(batch_size=3))
    dm.setup()
    assert next(iter(dm.train_dataloader()))["count"] == 3
    assert [b["count"] for b in dm.test_dataloader()] == [3, 3, 3, 1]


def test_a_second_run_reads_the_first_runs_default_build(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # empty: this test's first run builds
    Numbers.builds.clear()
    first = Numbers(config(run_dir=str(tmp_path / "one")))
    first.prepare_data()
    first.setup()
    second = Numbers(config(run_dir=str(tmp_path / "two")))
    second.prepare_data()
    second.setup()
    path = first.data_path()
    assert second.data_path() == path and path.is_relative_to(cache_root()) and path.name == "numbers.txt"
    assert len(Numbers.builds) == 1 and len(second.datasets["train"]) == 10
    assert not (tmp_path / "one").exists() and not (tmp_path / "two").exists()  # nothing in the run folders


def test_a_given_data_path_is_read_and_nothing_is_built(tmp_path):
    Numbers.builds.clear()
    (tmp_path / "mine.txt").write_text("1 2 3\n")
    dm = Numbers(config(path=str(tmp_path / "mine.txt")))
    dm.prepare_data()
    dm.setup()
    assert dm.data_path() == tmp_path / "mine.txt" and len(dm.datasets["train"]) == 3 and Numbers.builds == []


def test_bucket_lengths_are_powers_of_two_up_to_the_maximum():
    from lavo_tasks.data import bucket_length, pad_batch

    assert [bucket_length(n, 12) for n in (1, 2, 3, 4, 5, 8, 9, 12)] == [1, 2, 4, 4, 8, 8, 12, 12]
    out, mask = pad_batch([torch.tensor([1, 2, 3]), torch.tensor([4])], 0, maximum=12)
    assert out.tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]] and mask.sum(1).tolist() == [3, 1]
    with pytest.raises(ValueError, match="a sequence of 3 positions is longer than the maximum 2"):
        pad_batch([torch.tensor([1, 2, 3])], 0, maximum=2)
