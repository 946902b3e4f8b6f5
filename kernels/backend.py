"""Which implementation runs an attention call: Triton kernels or the PyTorch path."""

import os
import warnings
from collections.abc import Callable

import torch

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "LAVO_TASKS_BACKEND"


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Turn `backend` into "triton" or "torch".

    "auto" means Triton on CUDA tensors and PyTorch otherwise; the environment variable
    LAVO_TASKS_BACKEND (auto/triton/torch) overrides "auto" only, so an explicit
    argument always wins. "triton" on CPU tensors is allowed: it runs under Triton's
    interpreter when TRITON_INTERPRET=1 was set before triton was imported.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: allowed {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = os.environ.get(ENV_VAR, "auto")
        if backend not in BACKENDS:
            raise ValueError(f"{ENV_VAR}={backend!r}: allowed {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "triton" if tensors and all(t.is_cuda for t in tensors) else "torch"
    return backend


def run_triton(requested: str, function: str, triton_call: Callable, torch_call: Callable):
    """Run `triton_call()`; a case the kernels do not cover (they raise NotImplementedError:
    float64, a head dim over their limit, ...) or a missing kernel module runs
    `torch_call()` instead with a RuntimeWarning when the caller asked for "auto", and
    raises when it asked for "triton" explicitly."""
    try:
        return triton_call()
    except (ImportError, NotImplementedError) as err:
        if requested != "auto":
            raise
        warnings.warn(f"{function}: Triton path unavailable ({type(err).__name__}: {err}); "
                      "running the PyTorch path", RuntimeWarning, stacklevel=3)
    return torch_call()
