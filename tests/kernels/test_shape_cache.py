"""kernels.common.shape_cache: the per-shape table cache whose values are built outside
any CUDA graph memory pool (on a thread of their own), with the CUDA case on the GPU."""

import threading

import pytest
import torch

from lavo_tasks.kernels.common import shape_cache


def test_a_miss_builds_once_on_the_builder_thread_and_hits_return_the_same_value():
    built = []

    @shape_cache(maxsize=4)
    def table(n, device):
        built.append((n, threading.current_thread().name))
        return torch.arange(n, device=device)

    first = table(3, torch.device("cpu"))
    assert table(3, torch.device("cpu")) is first
    assert torch.equal(first, torch.arange(3))
    table(5, torch.device("cpu"))
    assert [n for n, _ in built] == [3, 5]
    assert all(name.startswith("kernel-tables") for _, name in built)
    assert threading.current_thread().name not in {name for _, name in built}


def test_a_table_built_from_another_does_not_wait_for_itself():
    @shape_cache(maxsize=4)
    def inner(n, device):
        return torch.ones(n, device=device)

    @shape_cache(maxsize=4)
    def outer(n, device):
        return inner(n, device).cumsum(0)

    result = []
    caller = threading.Thread(target=lambda: result.append(outer(4, torch.device("cpu"))), daemon=True)
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive(), "outer() never returned: the nested build waited for the builder thread"
    assert torch.equal(result[0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert inner(4, torch.device("cpu")) is not None


def test_a_failed_build_raises_to_the_caller_and_is_not_cached():
    calls = []

    @shape_cache(maxsize=4)
    def table(n, device):
        calls.append(n)
        if len(calls) == 1:
            raise ValueError("first build fails")
        return torch.zeros(n)

    with pytest.raises(ValueError, match="first build fails"):
        table(2, torch.device("cpu"))
    assert torch.equal(table(2, torch.device("cpu")), torch.zeros(2))
    assert calls == [2, 2]


@pytest.mark.gpu
def test_tables_built_while_a_graph_pool_takes_allocations_stay_out_of_it():
    """What torch.compile's CUDA graph trees do while they warm a graph up: every
    allocation of the thread goes to the graph's pool. The LAVO chunk layout built then
    must not (a replay would overwrite it); a plain allocation does (the control)."""
    from lavo_tasks.kernels.lavo import chunk

    device = torch.device("cuda", torch.cuda.current_device())
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        control = torch.empty(1 << 20, device=device)
        layout = chunk._batched_layout(3, 200, 200, 64, False, device)  # a shape no other test takes
    in_pool = set()  # the addresses of the pool's live blocks (as cudagraph_trees.check_memory_pool reads them)
    for segment in pool.snapshot():
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                in_pool.add(address)
            address += block["size"]
    assert control.data_ptr() in in_pool
    for table in (layout.qchunks, layout.kchunks, layout.seqs, layout.qseq):
        assert table.is_cuda and table.untyped_storage().data_ptr() not in in_pool
    assert layout.qchunks[:, 4].tolist() == [0, 1, 2, 3] * 3  # the chunk index of each of the 4 chunks a sequence
