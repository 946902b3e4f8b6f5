"""Test metrics that agree across processes: torchmetrics Metrics over float64 sums.

A metric of a whole split that is a ratio of two sums over its items, such as
perplexity (exp of the NLL summed over tokens / the token count), MSE and MAE
(squared / absolute errors summed / the element count) or ND (summed absolute error /
summed absolute truth), is a `SumRatio`; a plain mean over elements is a `Mean`. Their
states are sums (float64, so a long split loses no digits) that torchmetrics adds up
over the processes in `compute()`, so each process may update on its own share of the
split and every process gets the value of the whole. Where a metric is another library's
(gluonts, ROUGE), wrap its per-item values in `Mean` or its sums in `SumRatio`; a
metric whose value is no ratio of sums (a median, a corpus statistic that needs the
items themselves) needs a `torchmetrics.Metric` with list states (`dist_reduce_fx="cat"`)
of its own.

Use: make the metric an attribute of the LightningModule (so it moves to the module's
device), `reset()` it at the start of the test epoch, `update(...)` in `test_step`,
and `compute()` in `on_test_epoch_end` on every process (the sum over processes is a
collective call: a process that skips it makes the others wait).
"""

import torch
from torchmetrics import Metric


class SumRatio(Metric):
    """sum(numerator) / sum(denominator), over every update on every process."""

    full_state_update = False  # update() only adds to the states

    def __init__(self):
        super().__init__()
        self.add_state("numerator", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("denominator", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, numerator: torch.Tensor, denominator: torch.Tensor | float) -> None:
        """Adds the sum of each argument (a tensor of any shape, or a number)."""
        # as float64 from the start: torch.as_tensor would make a Python float float32
        self.numerator += torch.as_tensor(numerator, dtype=torch.float64).detach().to(self.numerator).sum()
        self.denominator += torch.as_tensor(denominator, dtype=torch.float64).detach().to(self.denominator).sum()

    def compute(self) -> torch.Tensor:
        """A float64 scalar; ValueError when the denominators sum to 0 (e.g. no update
        on any process), which no ratio describes."""
        if self.denominator == 0:
            raise ValueError(f"{type(self).__name__}: the denominators sum to 0 over every process")
        return self.numerator / self.denominator


class Mean(SumRatio):
    """The mean of every element of every update on every process (each weighs the same
    however they fall into batches and processes)."""

    def update(self, values: torch.Tensor) -> None:
        super().update(values, values.numel())
