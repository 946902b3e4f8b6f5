"""Data pieces every task shares."""

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def step_generator(seed: int, step: int) -> torch.Generator:
    """A generator that depends only on (seed, step): what a step draws is the same
    whether or not the run was stopped and resumed before it."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class StepBatchSampler(Sampler[list[int]]):
    """An endless stream of training batches; batch k is drawn from `step_generator(seed, k)`.

    Training runs for `trainer.max_steps`, so there are no epochs to finish: a run
    resumed at global step k asks for `start_step=k` and sees exactly the batches an
    uninterrupted run would have seen from there on.
    """

    def __init__(self, n_items: int, batch_size: int, seed: int, start_step: int = 0):
        if n_items < 1:
            raise ValueError("StepBatchSampler needs at least one item")
        self.n_items, self.batch_size, self.seed, self.start_step = n_items, batch_size, seed, start_step

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            g = step_generator(self.seed, step)
            yield torch.randint(self.n_items, (self.batch_size,), generator=g).tolist()
            step += 1
