"""torch.compile of a task's model (`trainer.compile`): the modes, compiling, and the
warning about input shapes that change under CUDA graphs."""

import warnings

import torch
from omegaconf import DictConfig, OmegaConf

COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")


def compile_mode(cfg: DictConfig) -> str:
    """The config's `trainer.compile` ("off" when absent; YAML reads an unquoted off as false)."""
    mode = OmegaConf.select(cfg, "trainer.compile", default="off")
    return "off" if mode is False else mode


def compile_model(model: torch.nn.Module, mode: str) -> None:
    """torch.compile `model`'s forward in place (`mode` one of COMPILE_MODES but "off").
    The attention ops are custom operators (lavo_tasks.kernels), so the whole forward is
    one graph; "reduce-overhead" also captures it in CUDA graphs, one per input shape."""
    if mode not in COMPILE_MODES[1:]:
        raise ValueError(f"compile mode {mode!r}: allowed {', '.join(COMPILE_MODES)}")
    model.compile(mode=None if mode == "default" else mode)


class ShapeWatch:
    """Warns once when `model`'s tensor inputs change shape from one call to another:
    under CUDA graphs (trainer.compile=reduce-overhead) every new shape is compiled and
    recorded again, so a task whose batches vary in length recompiles at every step."""

    def __init__(self, model: torch.nn.Module, setting: str):
        self.setting, self.first, self.warned = setting, None, False
        # Not traced: a compiled model's hooks run outside its graph, and Dynamo would
        # otherwise compile this function itself, again whenever `first` or the shapes change.
        self.handle = model.register_forward_pre_hook(torch.compiler.disable(self._watch))

    def _watch(self, module, args) -> None:
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        if self.first is None:
            self.first = shapes
        elif shapes != self.first and not self.warned and module.training:
            self.warned = True
            warnings.warn(f"{self.setting}: the model's input shapes vary between steps ({self.first} then "
                          f"{shapes}), and every new shape compiles and records CUDA graphs again; pad the "
                          "batches to one length, or set trainer.compile=default", RuntimeWarning, stacklevel=2)
