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
