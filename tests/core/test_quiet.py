"""lavo_tasks.quiet: a tiny CPU run prints no tip, no num_workers advice, and a step count."""

import logging
import warnings

import torch
from omegaconf import OmegaConf

import lavo_tasks.quiet
from lavo_tasks import train
from lavo_tasks.quiet import quiet_lightning, set_fast_matmuls

LM_TINY = ["task=lm", "data.seq_len=8", "data.batch_size=2", "model.d_model=16", "model.n_layers=1",
           "model.n_heads=2", "model.d_ff=16", "generate.prompt_tokens=4", "generate.max_new_tokens=4",
           "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.val_check_interval=3",
           "trainer.max_steps=3"]


def test_a_tiny_run_shows_steps_and_holds_back_the_noise(tmp_path, capfd, caplog):
    corpus = tmp_path / "corpus"  # a few lines: quicker to read than the embedded stdlib corpus
    corpus.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (corpus / name).write_text("a quick fox and a lazy dog. " * 20)
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.run([*LM_TINY, f"data.path={corpus}", "trainer.enable_progress_bar=true", f"run.dir={tmp_path / 'run'}"])
    out = capfd.readouterr()
    printed = out.out + out.err + caplog.text
    assert "Steps" in printed and "3/3" in printed  # the bar counts the run's steps
    assert "Epoch 0" not in printed
    assert "Tip:" not in printed and "litlogger" not in printed
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "does not have many workers" in m or "LeafSpec" in m], messages
    assert "GPU available" in caplog.text  # Lightning's banner still comes


def test_the_filters_are_lifted_after_the_block():
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with quiet_lightning():
        assert lavo_tasks.quiet._NO_TIP in logger.filters
    assert lavo_tasks.quiet._NO_TIP not in logger.filters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("The 'train_dataloader' does not have many workers")
    assert len(caught) == 1


def test_tf32_matmuls_on_a_gpu_only(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", chosen.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for accelerator in ("auto", "gpu", "cpu"):
        set_fast_matmuls(OmegaConf.create({"trainer": {"accelerator": accelerator}}))
    assert chosen == ["high", "high"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    set_fast_matmuls(OmegaConf.create({"trainer": {"accelerator": "auto"}}))
    assert chosen == ["high", "high"]
