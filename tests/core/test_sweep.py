"""Sweeps: the grid from comma lists, bad values before any work, the SLURM job array and
the multi-node trainer config, and (slow) a real sweep killed halfway and started again."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from lavo_tasks import train
from lavo_tasks.config import compose
from lavo_tasks.errors import ConfigError
from lavo_tasks.run import RunDir
from lavo_tasks.run.trainer import build_trainer
from lavo_tasks.sweep import expand, split_values

TINY = ["task=tsf", "model.d_model=16", "model.n_heads=2", "model.encoder_layers=1", "model.decoder_layers=1",
        "model.d_ff=16", "data.seq_len=16", "data.label_len=8", "data.pred_len=4", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "trainer.enable_progress_bar=false"]


def test_commas_split_outside_brackets_and_quotes():
    assert split_values("attention=softmax,lavo,gsa") == ["attention=softmax", "attention=lavo", "attention=gsa"]
    assert split_values("x=[1,2],[3,4]") == ["x=[1,2]", "x=[3,4]"]
    assert split_values("x={a: 1, b: 2}") == ["x={a: 1, b: 2}"]
    assert split_values("x='a,b',c") == ["x='a,b'", "x=c"]
    with pytest.raises(ConfigError, match=r"argument 'x=\[1,2': unclosed bracket"):
        split_values("x=[1,2")
    with pytest.raises(ConfigError, match="an empty value"):
        split_values("seed=0,,1")


def test_grid_points_names_and_folder():
    points, run_dir = expand(["task=tsf", "attention=softmax,lavo", "seed=0,1", "run.dir=/tmp/s"])
    assert run_dir == "/tmp/s"
    assert [p.name for p in points] == ["0-attention=softmax_seed=0", "1-attention=softmax_seed=1",
                                        "2-attention=lavo_seed=0", "3-attention=lavo_seed=1"]
    assert points[2].args == ["task=tsf", "attention=lavo", "seed=0"]
    _, default = expand(["task=tsf", "seed=0,1"])
    assert Path(default).parent == Path("runs/tsf") and Path(default).name.startswith("sweep-")
    with pytest.raises(ConfigError, match="a sweep resumes its points itself"):
        expand(["seed=0,1", "run.resume=last"])


def test_a_bad_value_fails_before_any_run(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert train.main(["--multirun", "task=tsf", "trainer.max_steps=3,x", f"run.dir={sweep}"]) == 2
    err = capsys.readouterr().err
    assert err == "error: trainer.max_steps='x': expected an integer (default 300)\n"
    assert not sweep.exists()


def test_an_unwritable_sweep_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder\n")
    sweep = tmp_path / "file" / "sweep"
    assert train.main(["--multirun", "task=tsf", "seed=0,1", f"run.dir={sweep}"]) == 2
    assert capsys.readouterr().err == (f"error: run.dir={str(sweep)!r}: cannot write there (Not a directory); "
                                       "choose a folder you can write to\n")


def test_sbatch_array_and_its_point_commands_compose(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert train.main(["--multirun", "task=tsf", "attention=softmax,gsa", "seed=0,1,2", f"run.dir={sweep}",
                       "--sbatch"]) == 0
    script = (sweep / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-5\n" in script
    command = script.splitlines()[-1]
    assert command.endswith("--point=$SLURM_ARRAY_TASK_ID") and f"run.dir={sweep.absolute()}" in command
    assert not any(sweep.glob("*/config.yaml"))  # nothing ran
    # An array task's --point past the grid is refused as one line.
    assert train.main(["--multirun", "task=tsf", "attention=softmax,gsa", "seed=0,1,2", f"run.dir={sweep}",
                       "--point=6"]) == 2
    assert "--point=6: expected a point index in 0..5" in capsys.readouterr().err


def test_one_run_over_several_nodes_composes_under_slurm(tmp_path, monkeypatch):
    # What `srun python -m lavo_tasks.train trainer.num_nodes=2 trainer.devices=2 ...` sees on
    # the 4th task of a 2-node job: Lightning takes ranks and world size from SLURM.
    for key, value in {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                       "SLURM_NODEID": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7",
                       "SLURM_NODELIST": "node[1-2]"}.items():
        monkeypatch.setenv(key, value)
    rank = rank_zero_only.rank
    try:
        cfg = compose(["task=tsf", "trainer.num_nodes=2", "trainer.devices=2", "trainer.accelerator=cpu",
                       "trainer.strategy=ddp", f"run.dir={tmp_path}"])
        trainer = build_trainer(cfg, RunDir(tmp_path), fitting=False)
        assert (trainer.num_nodes, trainer.world_size, trainer.global_rank, trainer.local_rank) == (2, 4, 3, 1)
        assert type(trainer.strategy.cluster_environment).__name__ == "SLURMEnvironment"
    finally:
        rank_zero_only.rank = rank


def write_series(path: Path, rows: int) -> None:
    dates = pd.date_range("2020-01-01", periods=rows, freq="h")
    values = [float((i * 7) % 24) for i in range(rows)]
    pd.DataFrame({"date": dates, "a": values, "OT": values[::-1]}).to_csv(path, index=False)


@pytest.mark.slow
def test_a_sweep_killed_halfway_finishes_only_the_rest(tmp_path, capsys, monkeypatch):
    good, bad, good2 = tmp_path / "good.csv", tmp_path / "bad.csv", tmp_path / "good2.csv"
    write_series(good, 400)
    write_series(good2, 400)
    bad.write_text("date,a,OT\n")  # no rows: the point fails in its child process
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "lavo_tasks.train", "--multirun", *TINY, f"data.path={good},{bad},{good2}",
            "trainer.max_steps=60", "trainer.val_check_interval=1000", "trainer.log_every_n_steps=1",
            f"run.dir={sweep}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    names: list[str] = []
    # Until the third point has logged two training steps; a loaded 2-core machine (the
    # suite's other worker) can take minutes to get there, and a signal sent before it
    # trains would test nothing, so the wait is long and its end is checked.
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        names = sorted(p.name for p in sweep.iterdir() if p.is_dir()) if sweep.exists() else []
        if len(names) == 3:
            log = sweep / names[2] / "logs" / "metrics.csv"
            if log.is_file() and len(log.read_text().splitlines()) >= 3:
                break
        time.sleep(0.2)
    else:
        first.kill()
        pytest.fail(f"the third point did not train within 900 s; points: {names}")
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, err
    done, failed, stopped = (sweep / name for name in names)
    assert "stopped: SIGTERM during" in err and "again to skip the finished points and resume the rest" in err
    assert names[1] == "1-data.path=bad.csv"
    assert (done / "metrics.json").is_file() and (failed / "error.txt").is_file()
    assert "header" in (failed / "error.txt").read_text() or "row" in (failed / "error.txt").read_text()
    assert (stopped / "checkpoints" / "last.ckpt").is_file() and not (stopped / "metrics.json").exists()
    finished_at = (done / "metrics.json").stat().st_mtime_ns

    # The same command again, in this process (the first one was a real process, for its
    # signal); its points still run as child processes, with the first one's environment.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    capsys.readouterr()
    code = train.main(args[3:])
    second = capsys.readouterr()
    assert code == 1, second.err  # the bad point fails again
    assert f"{done.name}: finished before: skipped" in second.out
    assert f"{stopped.name}: resumed, done" in second.out
    # good2.csv is good.csv: the interrupted and resumed point tests exactly as the straight one.
    assert json.loads((stopped / "metrics.json").read_text()) == json.loads((done / "metrics.json").read_text())
    assert (done / "metrics.json").stat().st_mtime_ns == finished_at
    assert "run.resume=last" in (stopped / "sweep.log").read_text()
    steps = pd.read_csv(stopped / "logs" / "metrics.csv")["step"].dropna()
    assert steps.is_monotonic_increasing and steps.max() == 60  # continued, not restarted
    table = (sweep / "report.md").read_text()
    assert "| 1 | 0 |" in table and "| 0 | 1 |" in table  # per data.path group: finished or failed
    assert f"- {failed}:" in table
