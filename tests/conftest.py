"""Test-wide settings.

Without a GPU the Triton kernels run through Triton's interpreter, which must be
switched on before any kernel is compiled: that is done here, before test modules import.
Tests marked `gpu` need CUDA and are skipped without it (they run on the device machine).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture
def register_task(monkeypatch):
    """`register_task(name, module, yaml_text)`: make a task defined inside a test known
    to the task loader and the config composer, for this test only."""
    import lavo_tasks.config
    import lavo_tasks.tasks
    from omegaconf import OmegaConf

    def register(name, module, yaml_text):
        real_names, real_load = lavo_tasks.tasks.task_names, lavo_tasks.tasks.load_task
        real_yaml = lavo_tasks.config.task_yaml
        monkeypatch.setattr(lavo_tasks.tasks, "task_names", lambda: sorted([*real_names(), name]))
        monkeypatch.setattr(lavo_tasks.tasks, "load_task", lambda n: module if n == name else real_load(n))
        monkeypatch.setattr(lavo_tasks.config, "task_yaml",
                            lambda n: OmegaConf.create(yaml_text) if n == name else real_yaml(n))

    return register
