"""Data pieces every task shares, and the seed rule.

One number, `seed`, seeds a run: the runner calls `lightning.seed_everything(seed)`
before it builds the model (so the initial weights depend on it), and whatever a
training step draws (its batch, its dropout) comes from `step_seed(seed, step)`, so a
resumed run repeats an uninterrupted one. Data that must not change with `seed` (an
embedded default dataset, a fixed sample of the validation split) uses a constant of its
own, named where it is defined.
"""

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset, Sampler

from .compiling import compile_mode
from .default_data import default_data


def step_seed(seed: int, step: int) -> int:
    """The seed of what training step `step` draws."""
    return seed * 1_000_003 + step


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator that depends only on (seed, step): what a step draws is the same
    whether or not the run was stopped and resumed before it."""
    return torch.Generator().manual_seed(step_seed(seed, step))


def process_rank(rank: int | None, world_size: int | None, who: str) -> tuple[int, int]:
    """(rank, world_size) as given, each defaulting to torch.distributed's when it is
    initialised (else 0 and 1); ValueError naming `who` when the rank is out of range."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    if not 0 <= rank < world_size:
        raise ValueError(f"{who}: rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


class StepBatchSampler(Sampler[list[int]]):
    """An endless stream of training batches; batch k is drawn from `step_generator(seed, k)`.

    Training runs for `trainer.max_steps`, so there are no epochs to finish: a run
    resumed at global step k asks for `start_step=k` and sees exactly the batches an
    uninterrupted run would have seen from there on.

    Under DDP each of the `world_size` processes takes its own `batch_size` items of the
    `world_size * batch_size` drawn for the step (`rank`, `world_size` default to
    torch.distributed's when it is initialised), so the run's global batches depend on
    (seed, step, world_size) only. The runner turns off Lightning's distributed sampler,
    which cannot wrap this one.
    """

    def __init__(self, n_items: int, batch_size: int, seed: int, start_step: int = 0,
                 rank: int | None = None, world_size: int | None = None):
        if n_items < 1:
            raise ValueError("StepBatchSampler needs at least one item")
        rank, world_size = process_rank(rank, world_size, "StepBatchSampler")
        self.n_items, self.batch_size, self.seed, self.start_step = n_items, batch_size, seed, start_step
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            g = step_generator(self.seed, step)
            drawn = torch.randint(self.n_items, (self.world_size * self.batch_size,), generator=g)
            yield drawn[self.rank * self.batch_size:(self.rank + 1) * self.batch_size].tolist()
            step += 1


class ShardSampler(Sampler[int]):
    """The items of an evaluation split that this process reads, in order: with `world_size`
    processes, process r reads the r-th of `world_size` contiguous shares (sizes differ
    by at most one; process 0 always reads the first item), so the shares together hold every item exactly once. (Lightning's
    DistributedSampler pads the shares to one size with repeated items, which would count
    them twice in a metric.) `rank`, `world_size` default to torch.distributed's when it
    is initialised. Metrics over the shares are summed across the processes by
    lavo_tasks.metrics; `trainer.limit_test_batches` counts each process's batches."""

    def __init__(self, n_items: int, rank: int | None = None, world_size: int | None = None):
        rank, world_size = process_rank(rank, world_size, "ShardSampler")
        # ceil(r * n / world_size): the larger shares come first, so process 0 holds item 0
        self.start, self.stop = -(-rank * n_items // world_size), -(-(rank + 1) * n_items // world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


def bucket_length(longest: int, maximum: int) -> int:
    """The length a batch whose longest sequence has `longest` positions is padded to when
    the model is compiled: the next power of two, at most `maximum` (the task's configured
    or its data's longest). So a compiled model sees a few shapes (log2(maximum) + 2 at
    most), never one per batch, and a batch is at most twice as long as its longest."""
    return min(maximum, 1 << (longest - 1).bit_length())


def pad_batch(seqs: list[torch.Tensor], value, maximum: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences [L_i, ...] (same trailing shape and dtype) stacked as [B, L, ...], each
    padded at its end with `value` to L: the longest, or with `maximum` its
    `bucket_length`. Also the mask [B, L] (True = real). ValueError when a sequence is
    longer than `maximum`."""
    longest = max(len(s) for s in seqs)
    length = longest
    if maximum is not None:
        if longest > maximum:
            raise ValueError(f"a sequence of {longest} positions is longer than the maximum {maximum}")
        length = bucket_length(longest, maximum)
    out = seqs[0].new_full((len(seqs), length, *seqs[0].shape[1:]), value)
    mask = torch.zeros(len(seqs), length, dtype=torch.bool)
    for row, s in enumerate(seqs):
        out[row, :len(s)], mask[row, :len(s)] = s, True
    return out, mask


class TaskDataModule(L.LightningDataModule):
    """What every task's data module shares: the step-batch training loader, the
    evaluation loaders and where the data is.

    A task's `setup` fills `self.datasets` ("train", "val", "test"). Then:
    - training reads `datasets["train"]` through StepBatchSampler (the batches depend on
      (seed, step) only, so a resumed run sees what an uninterrupted one would);
    - validation reads `datasets["val"]` in order, or, with `val_order_seed` set, in one
      fixed shuffled order, so that `trainer.limit_val_batches` samples the whole split
      instead of its start;
    - the test reads each process's share of `datasets["test"]` in order (ShardSampler;
      the task's metrics sum over the processes).
    Every loader collates with `collate_fn(fixed)` (None: torch's default collation).
    `fixed` is true for the training and validation loaders when the model is compiled
    (`trainer.compile` not off): a task that pads its batches then pads them to a few
    fixed lengths (`bucket_length`: powers of two up to its maximum), so that a compiled
    model sees a few shapes instead of one per batch length. The test's batches keep the
    longest of the batch (the test runs once, and generation is not compiled).

    `data_path()` is `data.path`, or the task's embedded default: `default_name` (a file
    or folder) written by `write_default(path)` and cached per machine under the key of
    `default_recipe()` (lavo_tasks.default_data).
    """

    val_order_seed: int | None = None
    default_name: str = ""

    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        self.datasets: dict[str, Dataset] = {}

    # -- where the data is -----------------------------------------------------------------

    def default_recipe(self) -> Mapping:
        """Everything the default data's files depend on (the cache key hashes it)."""
        raise NotImplementedError(f"task {self.cfg.task} has no embedded default; set data.path")

    def write_default(self, path: Path) -> None:
        """Write the default data at `path` (a file or folder that does not exist yet)."""
        raise NotImplementedError(f"task {self.cfg.task} has no embedded default; set data.path")

    def data_path(self) -> Path:
        """data.path, or the default data in the cache (built there first when this machine
        has none)."""
        if self.cfg.data.path:
            return Path(self.cfg.data.path)
        name = self.default_name
        return default_data(self.cfg.task, self.default_recipe(), lambda folder: self.write_default(folder / name)) / name

    def prepare_data(self) -> None:
        """Build the default data if this machine has none (a task without a file
        default, `default_name` "", makes its default in `setup`)."""
        if not self.cfg.data.path and self.default_name:
            self.data_path()

    # -- loaders ---------------------------------------------------------------------------

    def collate_fn(self, fixed: bool = False) -> Callable | None:
        """The loaders' collate function; `fixed`: pad to a few fixed lengths (class docstring)."""
        return None

    def fixed_shapes(self) -> bool:
        """Whether training and validation batches are padded to a few fixed lengths."""
        return compile_mode(self.cfg) != "off"

    def train_dataloader(self) -> DataLoader:
        dataset = self.datasets["train"]
        start_step = self.trainer.global_step if self.trainer is not None else 0
        sampler = StepBatchSampler(len(dataset), self.cfg.data.batch_size, self.cfg.seed, start_step=start_step)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=self.collate_fn(self.fixed_shapes()),
                          num_workers=self.cfg.data.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(self.datasets["val"], order_seed=self.val_order_seed, fixed=self.fixed_shapes())

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        return self.eval_loader(self.datasets["test"], shard=True)

    def eval_loader(self, dataset: Dataset, batch_size: int | None = None, shard: bool = False,
                    order_seed: int | None = None, fixed: bool = False) -> DataLoader:
        """Batches of `batch_size` (default data.batch_size) in order: this process's share
        with `shard`, a fixed permutation drawn from `order_seed` when given; `fixed`:
        padded to a few fixed lengths."""
        if shard:
            sampler = ShardSampler(len(dataset))
        elif order_seed is not None:
            sampler = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(order_seed)).tolist()
        else:
            sampler = None
        return DataLoader(dataset, batch_size=batch_size or self.cfg.data.batch_size, sampler=sampler, shuffle=False,
                          collate_fn=self.collate_fn(fixed), num_workers=self.cfg.data.num_workers)
