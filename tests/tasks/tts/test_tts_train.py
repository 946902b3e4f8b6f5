"""End-to-end runs of `task=tts` with every attention at tiny sizes: training, the test's
synthesis, metrics.json and the artifacts."""

import json

import numpy as np
import pytest
import soundfile as sf

from lavo_tasks import train
from lavo_tasks.errors import ConfigError

from compiled_step import assert_whole_compiled_run
from tiny import ATTENTIONS, ENCODER_DECODER, attention_args

TINY = [*ENCODER_DECODER, "model.conv_channels=16", "model.prenet_dim=16", "data.batch_size=4", "decode.max_frames=24",
        "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false"]
METRICS = {"test_loss", "test_mcd", "test_msd", "test_baseline_mcd", "test_baseline_msd", "test_length_ratio"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """An LJSpeech-layout folder of 40 short utterances: rising tones, one per sentence."""
    root = tmp_path_factory.mktemp("ljs")
    (root / "wavs").mkdir()
    lines = []
    for i in range(40):
        t = np.arange(int((0.15 + 0.01 * (i % 5)) * 22050)) / 22050
        sf.write(root / "wavs" / f"u{i:02d}.wav", (0.3 * np.sin(2 * np.pi * (150 + 10 * i) * t)).astype(np.float32),
                 22050, subtype="PCM_16")
        lines.append(f"u{i:02d}|Sentence {i}.|sentence number {i}.\n")
    (root / "metadata.csv").write_text("".join(lines))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTENTIONS)
def test_train_and_synthesise(name, dataset, tmp_path):
    run_dir = tmp_path / name
    metrics = train.run(["task=tts", f"attention={name}", f"run.dir={run_dir}", f"data.path={dataset}",
                         *TINY, *attention_args(name, window=8, slots=8)])
    assert set(metrics) >= METRICS and all(np.isfinite(v) for v in metrics.values())
    assert metrics["test_mcd"] > 0 and metrics["test_baseline_mcd"] > 0
    assert json.loads((run_dir / "metrics.json").read_text()) == pytest.approx(metrics)
    artifacts = run_dir / "artifacts"
    wavs = sorted((artifacts / "wavs").glob("*.wav"))
    assert len(wavs) == 4  # two test utterances (5 % of 40), synthesised and vocoded reference
    for wav in wavs:
        info = sf.info(wav)
        assert (info.samplerate, info.channels) == (22050, 1) and info.frames > 0
    assert (artifacts / "mels.png").stat().st_size > 0 and (artifacts / "stop.png").stat().st_size > 0
    # weights are drawn only where the cross-attention block forms them (softmax)
    assert (artifacts / "cross_attention.png").exists() == (name in ("softmax", "local"))


def test_guided_attention_needs_softmax_cross_attention(tmp_path):
    with pytest.raises(ConfigError, match=r"model.guided_attention=1.0: must be 0 unless the cross-attention is softmax"):
        train.run(["task=tts", "attention=lavo", "model.guided_attention=1.0", f"run.dir={tmp_path}"])


@pytest.mark.slow
def test_guided_attention_run(dataset, tmp_path):
    metrics = train.run(["task=tts", "attention=softmax", "model.guided_attention=1.0", f"run.dir={tmp_path}",
                         f"data.path={dataset}", *TINY])
    assert np.isfinite(metrics["test_loss"])
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("val_attention_loss" in record for record in logged)


def test_local_cannot_be_the_cross_attention(tmp_path):
    with pytest.raises(ConfigError, match=r"attention 'local' does not support causal cross-attention \(CC\)"):
        train.run(["task=tts", "attention=local", f"run.dir={tmp_path}"])


@pytest.mark.parametrize("arg, message", [
    ("data.frontend=letters", r"data.frontend='letters': must be one of characters, phonemes"),
    ("model.n_frames_per_step=0", r"model.n_frames_per_step=0: must be >= 1"),
    ("decode.stop_threshold=1.5", r"decode.stop_threshold=1.5: must be in \(0, 1\)"),
    ("data.sample_rate=8000", r"data.sample_rate=8000: must be an integer number of Hz >= 16000"),
    ("model.text_position_rate=0", r"model.text_position_rate='0': must be auto or a number > 0"),
    ("model.guided_attention=-1", r"model.guided_attention=-1: must be a number >= 0"),
    ("decode.cuda_graph=true trainer.accelerator=cpu",
     r"decode.cuda_graph=true: CUDA graphs need a CUDA GPU \(trainer.accelerator=cpu\)"),
    ("decode.cuda_graph=7", r"decode.cuda_graph=7: must be true, false or null"),
])
def test_bad_task_keys(arg, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        train.run(["task=tts", *arg.split(), f"run.dir={tmp_path}"])


@pytest.mark.gpu
def test_a_whole_run_compiled_with_cuda_graphs(dataset, tmp_path):
    metrics = assert_whole_compiled_run(["task=tts", "attention=lavo", *attention_args("lavo", window=8, slots=4),
                                         f"data.path={dataset}", *TINY], tmp_path / "run")
    assert METRICS <= set(metrics)
