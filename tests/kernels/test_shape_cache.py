"""kernels.common.shape_cache: the per-shape table cache whose values are built outside
any CUDA graph memory pool (on a thread of their own), with the CUDA case on the GPU."""

import gc
import threading
import weakref

import pytest
import torch

from lavo_tasks.kernels import common
from lavo_tasks.kernels.common import build_on_table_thread, shape_cache


def test_a_miss_builds_once_and_hits_return_the_same_value():
    built = []

    @shape_cache(maxsize=4)
    def table(n, device):
        built.append(n)
        return torch.arange(n, device=device)

    first = table(3, torch.device("cpu"))
    assert table(3, torch.device("cpu")) is first
    assert torch.equal(first, torch.arange(3))
    table(5, torch.device("cpu"))
    assert built == [3, 5]
    assert table.cache_info().currsize == 2


def test_the_table_thread_builds_and_a_table_built_from_another_does_not_wait_for_itself():
    """What a CUDA miss does (build_on_table_thread), here without a stream: the build runs
    on the builder's thread, and a cached table it asks for is built there in place (and
    cached), not submitted to the thread it already occupies."""
    threads = []

    @shape_cache(maxsize=4)
    def inner(n, device):
        threads.append(threading.current_thread().name)
        return torch.ones(n, device=device)

    def outer(n, device):
        threads.append(threading.current_thread().name)
        return inner(n, device).cumsum(0)

    result = []
    caller = threading.Thread(target=lambda: result.append(build_on_table_thread(outer, (4, torch.device("cpu")))),
                              daemon=True)
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive(), "outer() never returned: the nested build waited for the builder thread"
    assert torch.equal(result[0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert len(threads) == 2 and all(name.startswith("kernel-tables") for name in threads)
    assert inner.cache_info().currsize == 1
    inner(4, torch.device("cpu"))
    assert inner.cache_info().hits == 1 and len(threads) == 2


def test_a_failed_build_raises_to_the_caller_and_is_not_cached():
    calls = []

    def table(n, device):
        calls.append(n)
        if len(calls) == 1:
            raise ValueError("first build fails")
        return torch.zeros(n)

    cached = shape_cache(maxsize=4)(table)
    with pytest.raises(ValueError, match="first build fails"):
        cached(2, torch.device("cpu"))
    assert torch.equal(cached(2, torch.device("cpu")), torch.zeros(2))
    assert calls == [2, 2]
    with pytest.raises(ValueError, match="first build fails"):  # and on the table thread, to its caller
        calls.clear()
        build_on_table_thread(table, (2, torch.device("cpu")))


def test_a_table_looked_up_while_a_graph_is_captured_outlives_its_eviction(monkeypatch):
    """Evicting a table frees it, unless a CUDA graph was captured reading it (the graph
    holds its address, not a reference): that one stays. (Capture is simulated: the
    tables here are CPU tensors, whose misses build in place.)"""

    @shape_cache(maxsize=2)
    def table(n, device):
        return torch.arange(n, device=device)

    monkeypatch.setattr(common, "_PINNED", {})  # this test's pins, dropped after it
    cpu = torch.device("cpu")
    read_by_graph, plain = weakref.ref(table(3, cpu)), weakref.ref(table(4, cpu))
    monkeypatch.setattr(common, "_capturing", lambda device: True)
    table(3, cpu)  # a hit while "capturing"
    monkeypatch.setattr(common, "_capturing", lambda device: False)
    for n in (5, 6, 7):  # evicts 3 and 4
        table(n, cpu)
    gc.collect()
    assert table.cache_info().currsize == 2
    assert plain() is None
    assert read_by_graph() is not None and torch.equal(read_by_graph(), torch.arange(3))


@pytest.mark.gpu
def test_tables_built_while_a_graph_pool_takes_allocations_stay_out_of_it():
    """What torch.compile's CUDA graph trees do while they warm a graph up: every
    allocation of the thread goes to the graph's pool. The LAVO chunk layout built then
    must not (a replay would overwrite it); a plain allocation does (the control)."""
    from lavo_tasks.kernels.lavo import chunk

    device = torch.device("cuda", torch.cuda.current_device())
    chunk._batched_layout.cache_clear()  # so that the call below misses
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        control = torch.empty(1 << 20, device=device)
        layout = chunk._batched_layout(3, 200, 200, 64, False, device)
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
