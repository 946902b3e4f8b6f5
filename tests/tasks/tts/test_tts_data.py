"""The LJSpeech-layout reader, its splits and feature cache, every bad input, and the
log-mel features against a numpy STFT and Slaney filter bank written out here."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from lavo_tasks.config import compose
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.tasks.tts import check_config
from lavo_tasks.tasks.tts.audio import LogMel, MelConfig, read_wav
from lavo_tasks.tasks.tts.data import FeatureCache, TTSDataModule, read_metadata, split_utterances
from lavo_tasks.tasks.tts.text import EOS, UNK, build_vocabulary, encode, normalize

RATE = 22_050


def tone(seconds: float, hz: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def write_dataset(root: Path, ids: list[str], lines: list[str] | None = None, rate: int = RATE) -> Path:
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    for i, uid in enumerate(ids):
        sf.write(root / "wavs" / f"{uid}.wav", tone(0.2 + 0.05 * i, 200 + 40 * i, rate), rate, subtype="PCM_16")
    if lines is None:
        lines = [f"{uid}|Text number {i}.|text number {i}." for i, uid in enumerate(ids)]
    (root / "metadata.csv").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return root


def data_config(root: Path, tmp_path: Path, *extra: str):
    return compose(["task=tts", f"data.path={root}", f"run.dir={tmp_path / 'run'}", *extra])


# --- metadata


def test_metadata_fields_and_normalisation(tmp_path):
    root = write_dataset(tmp_path / "d", ["a", "b", "c"], [
        "a|Dr. Smith paid $5.|Doctor Smith paid five dollars.",
        "b|Only two fields, Café  OK",
        "c|Third|",  # an empty normalised field falls back to the text
    ])
    utterances = read_metadata(root)
    assert [u.id for u in utterances] == ["a", "b", "c"]
    assert [u.text for u in utterances] == ["doctor smith paid five dollars.", "only two fields, cafe ok", "third"]
    assert utterances[1].wav == root / "wavs" / "b.wav" and utterances[2].line == 3


@pytest.mark.parametrize("lines, message", [
    (["a|x|x", "b|x|x|extra", "c|x|x"], r"metadata.csv: line 2: 4 fields"),
    (["a|x|x", "b", "c|x|x"], r"metadata.csv: line 2: 1 fields"),
    (["a|x|x", "b| | ", "c|x|x"], r"metadata.csv: line 2: empty transcript for id 'b'"),
    (["a|x|x", "|x|x", "c|x|x"], r"metadata.csv: line 2: empty id"),
    (["a|x|x", "b|x|x", "a|y|y"], r"metadata.csv: line 3: id 'a' repeats line 1"),
    (["a|x|x", "b|x|x", "z|x|x"], r"line 3: id 'z' has no wav at .*wavs/z.wav"),
])
def test_bad_metadata_names_file_and_line(tmp_path, lines, message):
    root = write_dataset(tmp_path / "d", ["a", "b", "c"], lines)
    with pytest.raises(DataError, match=message):
        read_metadata(root)


def test_no_metadata_csv(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"data.path=.*empty.*no metadata.csv"):
        read_metadata(tmp_path / "empty")


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b"RIFF not really a wave file"), r"a.wav: not a readable audio file"),
    (lambda p: sf.write(p, np.zeros(0, np.float32), RATE), r"a.wav: no audio samples"),
    (lambda p: sf.write(p, np.zeros((100, 2), np.float32), RATE), r"a.wav: 2 channels; the TTS data must be mono"),
])
def test_bad_wav_is_one_error_and_leaves_the_cache_whole(tmp_path, damage, message):
    root = write_dataset(tmp_path / "d", ["b", "c", "a"])  # a is read last: b and c get cached first
    damage(root / "wavs" / "a.wav")
    cache = FeatureCache(tmp_path / "cache", MelConfig())
    with pytest.raises(DataError, match=message):
        cache.load(read_metadata(root))
    files = sorted(p.name for p in cache.folder.iterdir())
    assert files == ["b.pt", "c.pt"]  # no temporary or partial file
    for name in files:
        assert torch.load(cache.folder / name, weights_only=True)["mel"].shape[1] == 80


def test_sample_rate_must_be_an_integer(tmp_path):
    with pytest.raises(ConfigError, match=r"data.sample_rate='22050.5': expected an integer"):
        compose(["task=tts", "data.sample_rate=22050.5"])
    cfg = compose(["task=tts"])
    cfg.data.sample_rate = 22050.5  # as a YAML file could give it
    with pytest.raises(ConfigError, match=r"data.sample_rate=22050.5: must be an integer number of Hz"):
        check_config(cfg)


def test_bad_input_is_one_line_on_the_command_line(tmp_path):
    root = write_dataset(tmp_path / "d", ["a", "b", "c"], ["a|x|x", "b|x", "c|x|x|x"])
    result = subprocess.run(
        [sys.executable, "-m", "lavo_tasks.train", "task=tts", f"data.path={root}", f"run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    # Lightning's banner comes first; the error is the last line, and the only one.
    assert result.stderr.strip().splitlines()[-1] == (f"error: {root / 'metadata.csv'}: line 3: 4 fields; expected "
                                                      "id|text|normalized text (or id|text)")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "config.yaml").exists()


# --- splits


def test_fairseq_split_for_ljspeech_ids():
    from lavo_tasks.tasks.tts.data import Utterance
    ids = ["LJ001-0001", "LJ002-0010", "LJ003-0001", "LJ004-0001", "LJ050-0278"]
    splits = split_utterances([Utterance(i, "x", Path(i), n) for n, i in enumerate(ids)], seed=0)
    assert {k: [u.id for u in v] for k, v in splits.items()} == {
        "train": ["LJ004-0001", "LJ050-0278"], "val": ["LJ003-0001"], "test": ["LJ001-0001", "LJ002-0010"]}


def test_seeded_split_is_disjoint_and_repeatable():
    from lavo_tasks.tasks.tts.data import Utterance
    utterances = [Utterance(f"u{i}", "x", Path("w"), i) for i in range(100)]
    a, b, other = (split_utterances(utterances, seed) for seed in (0, 0, 1))
    assert a == b and a != other
    assert [len(a[s]) for s in ("train", "val", "test")] == [90, 5, 5]
    assert sorted(u.id for s in a.values() for u in s) == sorted(u.id for u in utterances)
    tiny = split_utterances(utterances[:3], 0)
    assert [len(tiny[s]) for s in ("train", "val", "test")] == [1, 1, 1]


# --- text


def test_vocabulary_and_encoding():
    assert normalize("  Ünïcode\tTEXT  ") == "unicode text"
    vocabulary = build_vocabulary(["ab", "ba c"])
    assert vocabulary[3:] == [" ", "a", "b", "c"]
    assert encode("cab?", vocabulary) == [6, 4, 5, UNK, EOS]


def test_phonemes_frontend():
    from lavo_tasks.tasks.tts.text import phonemize
    ipa = phonemize(["hello world"])[0]
    assert ipa.startswith("h") and "w" in ipa and "ˈ" in ipa


# --- features


def slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear, 3 mels per 200 Hz, up to 1 kHz; logarithmic above."""
    hz = np.asarray(hz, np.float64)
    linear = hz * 3 / 200
    return np.where(hz < 1000, linear, 15 + np.log(np.maximum(hz, 1e-9) / 1000) * 27 / np.log(6.4))


def slaney_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel < 15, mel * 200 / 3, 1000 * np.exp((mel - 15) * np.log(6.4) / 27))


def reference_log_mel(audio: np.ndarray, c: MelConfig) -> np.ndarray:
    """|STFT| (centred, reflect padding, periodic Hann) -> Slaney-normalised triangles -> log."""
    half = c.n_fft // 2
    padded = np.pad(audio.astype(np.float64), half, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(c.n_fft) / c.n_fft)
    starts = range(0, len(padded) - c.n_fft + 1, c.hop_length)
    magnitude = np.abs(np.stack([np.fft.rfft(padded[s:s + c.n_fft] * window) for s in starts]))  # [frames, bins]
    bins = np.arange(half + 1) * c.sample_rate / c.n_fft
    edges = slaney_hz(np.linspace(slaney_mel(c.f_min), slaney_mel(c.f_max), c.n_mels + 2))
    bank = np.zeros((half + 1, c.n_mels))
    for m in range(c.n_mels):
        lo, mid, hi = edges[m:m + 3]
        rising, falling = (bins - lo) / (mid - lo), (hi - bins) / (hi - mid)
        bank[:, m] = np.maximum(0, np.minimum(rising, falling)) * 2 / (hi - lo)
    return np.log(np.maximum(magnitude @ bank, 1e-5))


def test_log_mel_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    audio = (tone(0.5, 440) + 0.05 * rng.normal(size=int(0.5 * RATE))).astype(np.float32)
    config = MelConfig()
    ours = LogMel(config)(torch.from_numpy(audio)).double().numpy()
    reference = reference_log_mel(audio, config)
    assert ours.shape == reference.shape == (len(audio) // 256 + 1, 80)
    assert np.abs(ours - reference).max() < 1e-3


def test_resampled_on_reading(tmp_path):
    audio = tone(0.5, 300, rate=16_000)
    sf.write(tmp_path / "x.wav", audio, 16_000, subtype="FLOAT")
    ours = read_wav(tmp_path / "x.wav", RATE)
    assert ours.shape == (int(0.5 * RATE),)
    torch.testing.assert_close(ours, torchaudio.functional.resample(torch.from_numpy(audio), 16_000, RATE))


def test_feature_cache_is_rebuilt_when_a_wav_changes(tmp_path, monkeypatch):
    root = write_dataset(tmp_path / "d", ["a", "b", "c"])
    utterances = read_metadata(root)
    cache = FeatureCache(tmp_path / "cache", MelConfig())
    first = cache.load(utterances)

    import lavo_tasks.tasks.tts.data as data_module
    reads = []
    real_read = data_module.read_wav
    monkeypatch.setattr(data_module, "read_wav", lambda path, rate: reads.append(path.name) or real_read(path, rate))
    again = cache.load(utterances)
    assert reads == [] and all(torch.equal(first[k], again[k]) for k in first)

    sf.write(root / "wavs" / "b.wav", tone(0.4, 900), RATE, subtype="PCM_16")
    rebuilt = cache.load(utterances)
    assert reads == ["b.wav"]
    expected = LogMel()(real_read(root / "wavs" / "b.wav", RATE)).half().float()
    assert torch.equal(rebuilt["b"], expected) and rebuilt["b"].shape != first["b"].shape


def test_datamodule_normalises_with_training_statistics(tmp_path):
    root = write_dataset(tmp_path / "d", [f"u{i}" for i in range(20)])
    dm = TTSDataModule(data_config(root, tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    train = torch.cat([m for m in dm.datasets["train"].mels])  # normalised training frames
    torch.testing.assert_close(train.mean(0), torch.zeros(80), atol=1e-4, rtol=0)
    spec = dm.spec()
    assert len(spec["mel_mean"]) == 80 and spec["vocabulary"][:3] == ["<pad>", "</s>", "<unk>"]
    frames = sum(len(m) for m in dm.datasets["train"].mels)
    symbols = sum(len(t) for t in dm.datasets["train"].tokens)  # the EOS included
    assert spec["frames_per_symbol"] == pytest.approx(frames / symbols)
    batch = next(iter(dm.val_dataloader()))
    assert batch["tokens"][0, batch["token_lengths"][0] - 1] == EOS
    assert batch["mels"].shape[-1] == 80
