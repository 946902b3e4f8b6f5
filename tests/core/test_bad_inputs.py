"""Bad inputs to train and evaluate: each one is one line naming the key or file, exit
code 2, no traceback, before any training, and no run folder left behind.

The tiny task of test_train_cli stands in for a real one where the task does not matter;
the unwritable run.dir is tried on the tasks where it was reported (tsf, lm, summarization).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_train_cli import TinyData, tiny_task  # noqa: F401 (tiny_task: a fixture)

from lavo_tasks import evaluate, train
from lavo_tasks.config import compose
from lavo_tasks.errors import DataError
from lavo_tasks.provenance import checkpoint_record


def one_error_line(capsys) -> str:
    """The command's stderr, which must be exactly one `error: ...` line."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def saved_run(run_dir: Path, *args: str) -> Path:
    """A run folder holding only config.yaml, as train writes it (enough for run.resume
    and evaluate to find the run; the checks below fail before anything else is read)."""
    cfg = compose(["task=tiny", f"run.dir={run_dir}", *args])
    run_dir.mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / "config.yaml")
    return run_dir


def unwritable(where: str, tmp_path: Path) -> Path:
    if where == "proc":
        return Path("/proc/lavo-tasks-test/run")
    if where == "under a file":
        (tmp_path / "file").write_text("not a folder\n")
        return tmp_path / "file" / "run"
    if os.geteuid() == 0:
        pytest.skip("root may write into a read-only folder")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    return folder / "run"


@pytest.mark.parametrize("task", ["tsf", "lm", "summarization"])
@pytest.mark.parametrize("where", ["proc", "under a file", "read-only"])
def test_an_unwritable_run_dir(task, where, tmp_path, capsys):
    run_dir = unwritable(where, tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert train.main([f"task={task}", f"run.dir={run_dir}", "trainer.enable_progress_bar=false"]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"error: run.dir={str(run_dir)!r}: cannot write there ("), err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_bad_data_file_leaves_no_default_run_folder(tiny_task, tmp_path, monkeypatch, capsys):
    def partial_cache_then_bad_file(self, cfg):
        cache = Path(cfg.run.dir) / "data" / "cache.part"  # as a task's data cache would be
        cache.parent.mkdir(parents=True)
        cache.write_text("half")
        raise DataError("pairs.txt:3: expected two token ids")

    monkeypatch.setattr(TinyData, "__init__", partial_cache_then_bad_file)
    monkeypatch.chdir(tmp_path)
    assert train.main(["task=tiny"]) == 2
    assert one_error_line(capsys) == "error: pairs.txt:3: expected two token ids\n"
    assert list(tmp_path.iterdir()) == []  # not even runs/


def test_resume_from_a_file_that_is_no_checkpoint(tiny_task, tmp_path, capsys):
    run_dir = saved_run(tmp_path / "run")
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    assert train.main([f"run.dir={run_dir}", f"run.resume={text}"]) == 2
    assert one_error_line(capsys).startswith(f"error: run.resume={str(text)!r}: {text} is not a checkpoint (")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def other_task_checkpoint(path: Path, tmp_path: Path) -> Path:
    """A checkpoint as a tsf run records itself (its weights do not matter here)."""
    cfg = compose(["task=tsf", f"run.dir={tmp_path / 'tsf-run'}"])
    torch.save({"state_dict": {"model.w": torch.zeros(2)}, "global_step": 3,
                "lavo_tasks": checkpoint_record(cfg)}, path)
    return path


def test_train_and_evaluate_refuse_a_checkpoint_of_another_task(tiny_task, tmp_path, capsys):
    run_dir = saved_run(tmp_path / "run")
    best = other_task_checkpoint(tmp_path / "best.ckpt", tmp_path)
    expected = (f": a checkpoint of task tsf (run {tmp_path / 'tsf-run'}); run.dir={str(run_dir)!r} "
                "is a run of task tiny\n")
    assert train.main([f"run.dir={run_dir}", f"run.resume={best}"]) == 2
    assert one_error_line(capsys) == f"error: run.resume={str(best)!r}{expected}"
    assert evaluate.main([f"run.dir={run_dir}", f"ckpt={best}"]) == 2
    assert one_error_line(capsys) == f"error: ckpt={str(best)!r}{expected}"
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_an_unknown_ckpt_lists_what_is_allowed(tiny_task, tmp_path, capsys):
    run_dir = saved_run(tmp_path / "run")
    assert evaluate.main([f"run.dir={run_dir}", "ckpt=worst"]) == 2
    assert one_error_line(capsys) == ("error: ckpt='worst': no checkpoint at worst; expected last | best | "
                                      "the path of a checkpoint file\n")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("arg, message", [
    ("trainer.limit_test_batches=0", "trainer.limit_test_batches=0: must be an integer >= 1 (batches of the test) "
                                     "or a fraction in (0, 1] of the split"),
    ("trainer.limit_test_batches=1.5", "trainer.limit_test_batches=1.5: must be an integer >= 1"),
    ("trainer.limit_val_batches=0", "trainer.limit_val_batches=0: must be an integer >= 1 (batches per validation)"),
    ("trainer.precision=bf17", "trainer.precision='bf17': allowed: auto, 64, 32, 16, transformer-engine,"),
    ("trainer.max_time=soon", "trainer.max_time='soon': expected null (no limit) or a duration DD:HH:MM:SS"),
    ("trainer.max_time=1:00", "trainer.max_time=60: expected null (no limit) or a duration DD:HH:MM:SS"),
    ("trainer.compile=fast", "trainer.compile='fast': allowed off, default, max-autotune, reduce-overhead\n"),
    ("trainer.compile=true", "trainer.compile='true': allowed off, default, max-autotune, reduce-overhead\n"),
])
def test_trainer_keys_name_themselves(tiny_task, tmp_path, capsys, arg, message):
    run_dir = tmp_path / "run"
    assert train.main(["task=tiny", f"run.dir={run_dir}", arg]) == 2
    assert one_error_line(capsys).startswith(f"error: {message}")
    assert not run_dir.exists()


def test_compile_where_it_cannot_run(tiny_task, tmp_path, capsys, monkeypatch):
    """reduce-overhead's CUDA graphs on the CPU; any compile on a CPU without a C compiler."""
    run_dir = tmp_path / "run"
    assert train.main(["task=tiny", f"run.dir={run_dir}", "trainer.accelerator=cpu",
                       "trainer.compile=reduce-overhead"]) == 2
    assert one_error_line(capsys) == ("error: trainer.compile=reduce-overhead: captures CUDA graphs and needs a GPU; "
                                      "on the CPU use default, max-autotune or off\n")
    monkeypatch.setattr("lavo_tasks.config.shutil.which", lambda name: None)
    assert train.main(["task=tiny", f"run.dir={run_dir}", "trainer.accelerator=cpu", "trainer.compile=default"]) == 2
    assert one_error_line(capsys) == ("error: trainer.compile=default: compiling on the CPU needs a C compiler (cc), "
                                      "none is on PATH; set trainer.compile=off\n")
    assert not run_dir.exists()
    from lavo_tasks.config import validate

    validate(compose(["task=tiny", "trainer.accelerator=cpu", "trainer.compile=off"]))  # off needs no compiler


def test_evaluate_refuses_a_test_of_no_batch(tiny_task, tmp_path, capsys):
    run_dir = saved_run(tmp_path / "run")
    assert evaluate.main([f"run.dir={run_dir}", "trainer.limit_test_batches=0"]) == 2
    assert one_error_line(capsys).startswith("error: trainer.limit_test_batches=0: must be an integer >= 1")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_the_accepted_trainer_values_still_pass(tiny_task):
    from lavo_tasks.config import validate

    for args in (["trainer.precision=bf16-mixed"], ["trainer.precision=16"], ["trainer.max_time=00:01:30:00"],
                 ["trainer.limit_test_batches=0.5", "trainer.limit_val_batches=1"]):
        validate(compose(["task=tiny", *args]))



def test_help_into_a_closed_pipe_is_no_traceback():
    """`--help | head -1`, with the reader gone before the first write, so every write fails."""
    command = [sys.executable, "-m", "lavo_tasks.train", "task=lm", "--help"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        child.stdout.close()
        err = child.stderr.read().decode()
        code = child.wait()
    assert (code, err) == (128 + signal.SIGPIPE, "")
