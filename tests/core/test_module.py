"""lavo_tasks.module: the non-finite-gradient stop of TaskModule, checked a step late, and
the warning about varying input shapes under trainer.compile=reduce-overhead.

The norm's finiteness goes to the host without a sync, so the check of step k runs at
step k + 1's clipping, or before a checkpoint save, a validation or the end of training,
whichever comes first (tests/core/test_train_cli.py runs it end to end)."""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from lavo_tasks.errors import Diverged
from lavo_tasks.module import TaskModule


def module_at(tmp_path, precision="32-true"):
    module = TaskModule(OmegaConf.create({"run": {"dir": str(tmp_path)}}))
    module.weight = torch.nn.Parameter(torch.ones(3))
    module._trainer = SimpleNamespace(precision=precision, global_step=0)
    return module, torch.optim.SGD([module.weight], lr=0.1)


def clip_step(module, optimizer, step, grad, loss=1.0):
    """Step `step` (0-based, as Lightning's global_step before its update): gradient `grad`."""
    module._trainer.global_step = step
    module.on_before_backward(torch.tensor(loss))
    module.weight.grad = torch.full((3,), grad)
    module.configure_gradient_clipping(optimizer, gradient_clip_val=1.0)


@pytest.mark.parametrize("then", ["next step", "checkpoint", "validation", "train end"])
def test_a_non_finite_gradient_stops_at_the_next_check_naming_its_step(tmp_path, then):
    module, optimizer = module_at(tmp_path)
    for step in range(3):
        clip_step(module, optimizer, step, 0.5)
    clip_step(module, optimizer, 3, float("nan"), loss=float("inf"))  # step 4 as the logs count; not read yet
    with pytest.raises(Diverged, match=r"^the gradients are not finite at step 4 \(train_loss inf on this process\)"):
        if then == "next step":
            clip_step(module, optimizer, 4, 0.5)
        elif then == "checkpoint":
            module.on_save_checkpoint({})
        elif then == "validation":
            module.on_validation_start()
        else:
            module.on_train_end()


def test_finite_gradients_pass_every_check(tmp_path):
    module, optimizer = module_at(tmp_path)
    for step in range(4):
        clip_step(module, optimizer, step, 0.5)
    module.on_save_checkpoint({})
    module.on_train_end()
    assert module._pending_norms == []


def test_fp16_leaves_non_finite_steps_to_its_loss_scaler(tmp_path):
    module, optimizer = module_at(tmp_path, precision="16-mixed")
    clip_step(module, optimizer, 0, float("inf"))
    clip_step(module, optimizer, 1, 0.5)
    module.on_train_end()


def test_varying_input_shapes_warn_once_under_cuda_graphs():
    from lavo_tasks.module import ShapeWatch

    model = torch.nn.Linear(4, 4)
    ShapeWatch(model, "trainer.compile=reduce-overhead", most=2)
    with pytest.warns(RuntimeWarning, match=r"^trainer.compile=reduce-overhead: the model's inputs have taken 3 "
                                            r"different shapes in training") as seen:
        for length in (5, 5, 7, 5, 7, 9, 11):
            model(torch.ones(2, length, 4))
    assert len([w for w in seen if "different shapes" in str(w.message)]) == 1
    few = torch.nn.Linear(4, 4)
    ShapeWatch(few, "trainer.compile=reduce-overhead", most=2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for length in (5, 7, 5, 7):  # two shapes, as bucketed batches have
            few(torch.ones(2, length, 4))
        few.eval()
        few(torch.ones(2, 9, 4))  # evaluation's shapes are not counted


def test_the_shape_watch_of_a_compiled_model_compiles_nothing_of_its_own():
    """The hook runs outside the model's graph; traced, Dynamo compiled it again whenever
    the shapes it keeps changed."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from lavo_tasks.compiling import ShapeWatch

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))  # torch.nn's own code: Dynamo compiles no frame of it
    ShapeWatch(model, "trainer.compile=reduce-overhead", most=2)
    model.compile(backend="aot_eager")
    with pytest.warns(RuntimeWarning, match="different shapes"):
        for length in (3, 3, 5, 5, 7):
            model(torch.ones(2, length, 4))
    assert not counters["frames"], dict(counters["frames"])
