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
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if rank is None:
            rank = torch.distributed.get_rank() if distributed else 0
        if world_size is None:
            world_size = torch.distributed.get_world_size() if distributed else 1
        if not 0 <= rank < world_size:
            raise ValueError(f"StepBatchSampler: rank {rank} is not in [0, world_size={world_size})")
        self.n_items, self.batch_size, self.seed, self.start_step = n_items, batch_size, seed, start_step
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            g = step_generator(self.seed, step)
            drawn = torch.randint(self.n_items, (self.world_size * self.batch_size,), generator=g)
            yield drawn[self.rank * self.batch_size:(self.rank + 1) * self.batch_size].tolist()
            step += 1
