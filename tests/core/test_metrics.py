"""lavo_tasks.metrics: the sums, and their sum over two processes (gloo)."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lavo_tasks.metrics import Mean, SumRatio


def test_mean_weighs_every_element_the_same_across_uneven_batches():
    values = [[1.0, 2.0, 3.0], [10.0]]  # mean of batch means: 6.0; of elements: 4.0
    metric = Mean()
    for batch in values:
        metric.update(torch.tensor(batch))
    assert metric.compute().item() == 4.0
    assert metric.compute().dtype == torch.float64


def test_sum_ratio_of_hand_computed_sums():
    metric = SumRatio()
    metric.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 8)  # 10 / 8
    metric.update(torch.tensor(5.0), torch.tensor([1.0, 1.0]))  # + 5 / + 2
    assert metric.compute().item() == 1.5


def test_float64_sums_keep_small_additions():
    metric = Mean()
    metric.update(torch.tensor([1e8], dtype=torch.float64))
    metric.update(torch.ones(4, dtype=torch.float64))  # lost in a float32 sum (ulp of 1e8 is 8)
    assert metric.compute().item() == (1e8 + 4) / 5


def test_reset_starts_again_and_zero_denominator_is_an_error():
    metric = Mean()
    metric.update(torch.tensor([7.0]))
    metric.reset()
    with pytest.raises(ValueError, match="denominators sum to 0"), pytest.warns(UserWarning, match="before the"):
        metric.compute()
    metric.update(torch.tensor([2.0]))
    assert metric.compute().item() == 2.0


def test_states_stay_out_of_a_module_state_dict():
    """Checkpoints hold weights only: a metric attribute adds no keys."""
    module = nn.Module()
    module.ppl = nn.ModuleList([Mean(), SumRatio()])
    module.ppl[0].update(torch.tensor([1.0]))
    assert module.state_dict() == {}


def _two_process_worker(rank: int, init_file: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        mean, ratio = Mean(), SumRatio()
        shares = {0: [0.5, 1.5, 2.5], 1: [4.0]}  # uneven shares: 3 elements and 1
        mean.update(torch.tensor(shares[rank]))
        ratio.update(torch.tensor(shares[rank]), torch.tensor([2.0] * len(shares[rank])))
        results[rank] = (mean.compute().item(), ratio.compute().item())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters: ~20 s on a busy 2-core machine
def test_two_processes_each_get_the_value_of_the_whole(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_two_process_worker, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
    whole = [0.5, 1.5, 2.5, 4.0]
    expected = (sum(whole) / 4, sum(whole) / 8)
    assert results[0] == results[1]
    assert all(math.isclose(a, b, rel_tol=1e-15) for a, b in zip(results[0], expected))
