"""Data pieces every task shares, and the seed rule.

One number, `seed`, seeds a run: the runner calls `lightning.seed_everything(seed)`
before it builds the model (so the initial weights depend on it), and whatever a
training step draws (its batch, its dropout) comes from `step_seed(seed, step)`, so a
resumed run repeats an uninterrupted one. Data that must not change with `seed` (an
embedded default dataset, a fixed sample of the validation split) uses a constant of its
own, named where it is defined.
"""

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


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
