"""How often a task's compiled training step compiles, and whether it computes the eager
step's loss; whether an eager step waits for the GPU; whether a whole compiled run
completes (importable as `compiled_step`, like `tiny`).

The model is compiled with backend="aot_eager": Dynamo's frames and guards and
AOTAutograd's forward and backward graphs, run eagerly, so the recompiles are those of
any backend (Inductor on the CPU would add minutes of C++ compiling and nothing here)."""

import copy
import itertools
import math
import warnings
from pathlib import Path

import torch
import torch._dynamo
from lightning.pytorch.utilities import move_data_to_device
from torch._dynamo.utils import counters

from lavo_tasks import tasks, train
from lavo_tasks.bench_e2e import module_and_first_batch, training_step
from lavo_tasks.config import validate


def compiled_steps(cfg, steps: int):
    """Runs the first `steps` training batches of the task's DataModule through its
    Module's `training_step` + backward twice: with the model compiled, and with an eager
    copy (the same weights, the same random state per step). `cfg` must turn
    trainer.compile on (the DataModule then pads to fixed lengths). Returns (frames
    compiled, [(compiled loss, eager loss) per step], the batches)."""
    validate(cfg)
    task = tasks.load_task(cfg.task)
    datamodule = task.DataModule(cfg)
    torch.manual_seed(0)
    compiled = task.Module(cfg, datamodule.spec())
    eager = copy.deepcopy(compiled)
    torch._dynamo.reset()
    counters.clear()
    compiled.model.compile(backend="aot_eager")
    batches = list(itertools.islice(datamodule.train_dataloader(), steps))
    losses = []
    with warnings.catch_warnings():  # the Module logs train_loss; no Trainer is here to take it
        warnings.filterwarnings("ignore", message=".*self.log.*")
        for i, batch in enumerate(batches):
            pair = []
            for module in (compiled, eager):
                torch.manual_seed(i)
                loss = module.training_step(batch, i)
                loss.backward()
                module.zero_grad(set_to_none=True)
                pair.append(loss.detach())
            losses.append(tuple(pair))
    return counters["frames"]["ok"], losses, batches


def batch_shapes(batch) -> tuple:
    """The shapes of a batch's tensors (a dict's, in key order, or a sequence's)."""
    values = batch.values() if isinstance(batch, dict) else batch
    return tuple(tuple(v.shape) for v in values if isinstance(v, torch.Tensor))


def assert_few_graphs_and_eager_losses(cfg, steps: int = 3, most: int = 1):
    """At most `most` frames compiled over `steps` steps, and no more than the batches
    have shapes; each step's loss the eager model's (the recompile reasons print with
    TORCH_LOGS=recompiles). Returns the batches."""
    frames, losses, batches = compiled_steps(cfg, steps)
    assert len(losses) == steps
    shapes = {batch_shapes(b) for b in batches}
    assert 1 <= frames <= min(most, len(shapes)), f"{frames} frames compiled over {steps} steps of {len(shapes)} shapes"
    for got, want in losses:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    return batches


def eval_module_and_first_batch(cfg):
    """The task's Module on the CPU in eval mode (no dropout) and its first training batch."""
    validate(cfg)
    module, batch = module_and_first_batch(cfg)
    return module.eval(), batch


def with_model_output(module, call):
    """(call()'s result, what the module's model returned during it), no grad."""
    seen = []
    handle = module.model.register_forward_hook(lambda _module, _inputs, output: seen.append(output))
    with torch.no_grad(), warnings.catch_warnings():  # the Module logs train_loss; no Trainer is here
        warnings.filterwarnings("ignore", message=".*self.log.*")
        result = call()
    handle.remove()
    return result, seen[-1]


def assert_training_step_sync_free(cfg):
    """On the GPU, one training step of the task's Module (its `training_step` under bf16
    autocast, backward, a fused AdamW step) on its DataModule's first batch never waits
    for the GPU: it runs under torch.cuda.set_sync_debug_mode("error"), after a warm-up
    step (Triton compiles, cached tables), and raises at the first synchronising call."""
    validate(cfg)
    module, batch = module_and_first_batch(cfg)
    module = module.cuda().train()
    batch = move_data_to_device(batch, torch.device("cuda"))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)

    def step():
        return training_step(module, batch, optimizer, torch.autocast("cuda", dtype=torch.bfloat16))

    with warnings.catch_warnings():  # the Module logs train_loss; no Trainer is here to take it
        warnings.filterwarnings("ignore", message=".*self.log.*")
        step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss)


def assert_whole_compiled_run(args: list[str], run_dir: Path, mode: str = "reduce-overhead") -> dict:
    """A whole `train.run` of `args` with trainer.compile=mode: training, validation,
    checkpoints, the test and its generation, what bench_e2e's loop of training steps
    leaves out. It completes with finite test metrics and best.ckpt in `run_dir`, and
    never warns that the compiled model's inputs keep changing shape (each new shape
    records CUDA graphs again). Returns the metrics. Dynamo and the CUDA graph trees are
    reset afterwards, so the next run in the process (an xdist worker runs several)
    starts from a clean slate, as a run of its own would."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            metrics = train.run([*args, f"run.dir={run_dir}", f"trainer.compile={mode}"])
        finally:
            torch._dynamo.reset()
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    assert (run_dir / "checkpoints" / "best.ckpt").is_file()
    reshaped = [str(w.message) for w in caught if "different shapes" in str(w.message)]
    assert not reshaped, reshaped[0]
    return metrics
