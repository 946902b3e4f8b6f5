"""Test-wide settings.

Without a GPU the Triton kernels run through Triton's interpreter, which must be
switched on before any kernel is compiled: that is done here, before test modules import
(in every pytest-xdist worker too, each of which imports this file first).
Tests marked `gpu` need CUDA and are skipped without it (they run on the device machine).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores in all: under pytest-xdist each of the workers gets its share, and so do the
# processes a test starts (notebook kernels, CLI runs, sweep points) through the environment.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREADS = max(1, min(2, torch.get_num_threads()) // _WORKERS)
torch.set_num_threads(_THREADS)
os.environ["OMP_NUM_THREADS"] = str(_THREADS)


@pytest.fixture(autouse=True, scope="session")
def default_data_cache(tmp_path_factory):
    """The default-data cache (lavo_tasks.default_data) of the whole session: a temporary
    folder, never the user's own cache; the runs a test starts as processes inherit it.
    pytest-xdist's local workers share one (each one's base folder, popen-gwN, is inside
    the session's), so a default dataset is built once per session rather than once per
    worker; two workers that build the same one at once both finish, as two runs would."""
    from lavo_tasks.default_data import CACHE_ENV

    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("popen-gw"):
        folder = base.parent / "default-data"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("default-data")
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if saved is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = saved


def _start_order(item) -> int:
    """0 for the notebooks (the longest tests), 1 for the other `slow` tests, 2 for the rest."""
    if "slow" not in item.keywords:
        return 2
    return 0 if item.path.name == "test_notebooks.py" else 1


def pytest_collection_modifyitems(config, items):
    # The longest tests first (a stable sort: collection order within each group). Under
    # pytest-xdist's worksteal each worker then ends on short tests, taken from the other's
    # queue, instead of one worker running the last notebooks while the other waits.
    items.sort(key=_start_order)
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture
def register_task(monkeypatch):
    """`register_task(task, yaml_text)`: make a `lavo_tasks.task.Task` defined inside a
    test known to the task registry (and so to the config composer), for this test only.
    (tests/core/test_train_cli.py registers one from a folder, as a user would.)"""
    import lavo_tasks.tasks

    def register(task, yaml_text):
        real_names, real_load = lavo_tasks.tasks.task_names, lavo_tasks.tasks.load_task
        real_yaml = lavo_tasks.tasks.task_yaml_text
        monkeypatch.setattr(lavo_tasks.tasks, "task_names", lambda: sorted([*real_names(), task.name]))
        monkeypatch.setattr(lavo_tasks.tasks, "load_task", lambda n: task if n == task.name else real_load(n))
        monkeypatch.setattr(lavo_tasks.tasks, "task_yaml_text", lambda n: yaml_text if n == task.name else real_yaml(n))

    return register
