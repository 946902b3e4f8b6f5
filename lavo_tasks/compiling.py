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
    """Warns once when `model`'s tensor inputs in training have taken more than
    `most` different shapes: under CUDA graphs (trainer.compile=reduce-overhead) every new
    shape is recorded again, so a task whose batches take any length records at almost
    every step. The tasks that pad pad to a few lengths when compiled (lavo_tasks.data
    .bucket_length), which stays below the default."""

    def __init__(self, model: torch.nn.Module, setting: str, most: int = 8):
        self.setting, self.most, self.shapes, self.warned = setting, most, set(), False
        # Not traced: a compiled model's hooks run outside its graph, and Dynamo would
        # otherwise compile this function itself, again whenever the shapes change.
        self.handle = model.register_forward_pre_hook(torch.compiler.disable(self._watch))

    def _watch(self, module, args) -> None:
        if self.warned or not module.training:
            return
        self.shapes.add(tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        if len(self.shapes) > self.most:
            self.warned = True
            warnings.warn(f"{self.setting}: the model's inputs have taken {len(self.shapes)} different shapes in "
                          "training, and every new shape compiles and records CUDA graphs again; pad the batches "
                          "to a few lengths, or set trainer.compile=default", RuntimeWarning, stacklevel=2)
