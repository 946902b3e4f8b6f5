"""Data for text-to-speech: the LJSpeech layout.

    <data.path>/metadata.csv     id|text|normalized text   (pipe-separated, no header, no quoting;
                                 the third field may be left out, then the text is used)
    <data.path>/wavs/<id>.wav    mono audio, any sample rate (resampled to data.sample_rate)

The normalised text (the third field, else the second) goes through `text.normalize`
and the frontend (characters or phonemes). Split: when every id looks like LJSpeech's
(`LJ001-0001`), fairseq's: LJ001 and LJ002 test, LJ003 validation, the rest train;
otherwise a permutation seeded by `data.split_seed` puts 5 % in validation, 5 % in test
(at least one utterance each).

Features (`audio.LogMel`) are cached, one file per utterance, under
`<data.feature_cache>/<feature settings>/<id>.pt` with the wav's size and modification
time: a wav that changes is read again. The mels are normalised per band with the mean
and standard deviation of every training frame.

The embedded default (`data.path: ""`) is 400 sentences spoken by espeak-ng
(`speech.py`), written once per machine into the default-data cache
(lavo_tasks.default_data) and read by the same code; its features are cached beside it
unless `data.feature_cache` names a folder (with `data.path` set, that folder defaults to
`<run.dir>/features`).
"""

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset
from tqdm import tqdm

from ...data import TaskDataModule, pad_batch
from ...default_data import cache_root, recipe_key
from ...errors import ConfigError, DataError
from ...files import write_atomically
from . import speech
from .audio import LogMel, MelConfig, read_wav
from .text import PAD, build_vocabulary, encode, normalize, to_symbols

SPLITS = ("train", "val", "test")
HELD_OUT_FRACTION = 0.05  # of a seeded split, for validation and again for test
_LJ_ID = re.compile(r"LJ\d{3}-\d{4}")
_LJ_TEST, _LJ_VAL = ("LJ001", "LJ002"), ("LJ003",)


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str  # normalised
    wav: Path
    line: int  # in metadata.csv, from 1


def read_metadata(root: Path) -> list[Utterance]:
    """The utterances of `root/metadata.csv`, in file order; DataError naming the file
    and line of a malformed line, an empty transcript, a repeated id or a missing wav."""
    path = root / "metadata.csv"
    if not path.is_file():
        raise ConfigError(f"data.path={str(root)!r}: no metadata.csv there (the LJSpeech layout: "
                          "metadata.csv with id|text|normalized text lines, and wavs/<id>.wav)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start})") from None
    utterances, seen = [], {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) not in (2, 3):
            raise DataError(f"{path}: line {number}: {len(fields)} fields; expected id|text|normalized text "
                            "(or id|text)")
        uid = fields[0].strip()
        if not uid:
            raise DataError(f"{path}: line {number}: empty id")
        if uid in seen:
            raise DataError(f"{path}: line {number}: id {uid!r} repeats line {seen[uid]}")
        text = normalize(fields[-1]) or normalize(fields[1])
        if not text:
            raise DataError(f"{path}: line {number}: empty transcript for id {uid!r}")
        wav = root / "wavs" / f"{uid}.wav"
        if not wav.is_file():
            raise DataError(f"{path}: line {number}: id {uid!r} has no wav at {wav}")
        seen[uid] = number
        utterances.append(Utterance(uid, text, wav, number))
    if len(utterances) < 3:
        raise DataError(f"{path}: {len(utterances)} utterances; the train / validation / test split needs >= 3")
    return utterances


def split_utterances(utterances: list[Utterance], seed: int) -> dict[str, list[Utterance]]:
    """train / val / test (see the module docstring); each list in file order."""
    if all(_LJ_ID.fullmatch(u.id) for u in utterances):
        def split_of(u: Utterance) -> str:
            chapter = u.id[:5]
            return "test" if chapter in _LJ_TEST else "val" if chapter in _LJ_VAL else "train"
        splits = {name: [u for u in utterances if split_of(u) == name] for name in SPLITS}
        empty = [name for name, items in splits.items() if not items]
        if empty:
            raise DataError(f"LJSpeech-style ids but no utterance for the {', '.join(empty)} split "
                            f"(fairseq's split: {'/'.join(_LJ_TEST)} test, {'/'.join(_LJ_VAL)} validation)")
        return splits
    held_out = max(1, round(HELD_OUT_FRACTION * len(utterances)))
    order = torch.randperm(len(utterances), generator=torch.Generator().manual_seed(seed)).tolist()
    split_of = {i: "val" for i in order[:held_out]} | {i: "test" for i in order[held_out:2 * held_out]}
    return {name: [u for i, u in enumerate(utterances) if split_of.get(i, "train") == name] for name in SPLITS}


class FeatureCache:
    """Log-mels of wavs, one file per utterance, keyed by the wav's size and mtime.

    Stored as float16 (LJSpeech's 24 hours take 1.2 GB); returned as float32.
    """

    def __init__(self, folder: Path, mel: MelConfig):
        settings = f"mel-{mel.sample_rate}-{mel.n_fft}-{mel.hop_length}-{mel.n_mels}-{mel.f_min:g}-{mel.f_max:g}"
        self.folder = folder / settings
        self.mel = mel
        self.log_mel = LogMel(mel)

    def load(self, utterances: list[Utterance]) -> dict[str, torch.Tensor]:
        """{id: log-mel [frames, n_mels]}, extracting (with a progress bar) what is
        missing or stale."""
        self.folder.mkdir(parents=True, exist_ok=True)
        mels, stale = {}, []
        for u in utterances:
            cached = self._read(u)
            if cached is None:
                stale.append(u)
            else:
                mels[u.id] = cached
        for u in tqdm(stale, desc="log-mel features", unit="wav", disable=not stale):
            mel = self.log_mel(read_wav(u.wav, self.mel.sample_rate))
            record = {"source": self._stamp(u.wav), "mel": mel.half()}
            write_atomically(self.folder / f"{u.id}.pt", lambda f: torch.save(record, f))
            mels[u.id] = record["mel"].float()  # as a later run reads it back
        return mels

    @staticmethod
    def _stamp(wav: Path) -> tuple[int, int]:
        stat = wav.stat()
        return stat.st_size, stat.st_mtime_ns

    def _read(self, u: Utterance) -> torch.Tensor | None:
        path = self.folder / f"{u.id}.pt"
        if not path.is_file():
            return None
        try:
            record = torch.load(path, weights_only=True)
        except Exception:  # a damaged cache file is only a miss
            return None
        if tuple(record.get("source", ())) != self._stamp(u.wav):
            return None
        return record["mel"].float()


class TTSDataset(Dataset):
    """Item: `tokens` long [L] (ending with EOS), `mel` [frames, n_mels] normalised,
    `index` (into the split's utterance list)."""

    def __init__(self, tokens: list[list[int]], mels: list[torch.Tensor]):
        self.tokens = [torch.tensor(t) for t in tokens]
        self.mels = mels

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"tokens": self.tokens[i], "mel": self.mels[i], "index": i}


def collate(items: list[dict], maxima: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """tokens [B, L] padded with PAD, token_lengths [B], mels [B, T, n_mels] padded with
    0, mel_lengths [B], index [B]; L and T the batch's longest, or with `maxima` (tokens,
    frames) their buckets (lavo_tasks.data.bucket_length)."""
    token_max, frame_max = maxima or (None, None)
    return {
        "tokens": pad_batch([x["tokens"] for x in items], PAD, token_max)[0],
        "token_lengths": torch.tensor([len(x["tokens"]) for x in items]),
        "mels": pad_batch([x["mel"] for x in items], 0.0, frame_max)[0],
        "mel_lengths": torch.tensor([len(x["mel"]) for x in items]),
        "index": torch.tensor([x["index"] for x in items]),
    }


class TTSDataModule(TaskDataModule):
    """Reads (or writes) the data, extracts the features; `setup` makes
    `self.datasets[split]`, `self.utterances[split]` and the facts `spec()` hands the model."""

    default_name = "espeak"

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.mel = MelConfig(sample_rate=cfg.data.sample_rate)

    def default_recipe(self) -> dict:
        return speech.recipe()

    def write_default(self, path: Path) -> None:
        speech.write_default_dataset(path)

    def feature_folder(self) -> Path:
        """data.feature_cache; else beside the default data in the cache, or
        `<run.dir>/features` for data.path's."""
        if self.cfg.data.feature_cache:
            return Path(self.cfg.data.feature_cache)
        if not self.cfg.data.path:
            return cache_root() / self.cfg.task / f"{recipe_key(self.default_recipe())}-features"
        if not self.cfg.run.dir:
            raise ConfigError("run.dir is empty: the features of data.path are cached under <run.dir>/features "
                              "unless data.feature_cache names a folder")
        return Path(self.cfg.run.dir) / "features"

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.root = self.data_path()
        utterances = read_metadata(self.root)
        self.utterances = split_utterances(utterances, self.cfg.data.split_seed)
        mels = FeatureCache(self.feature_folder(), self.mel).load(utterances)

        symbols = dict(zip((u.id for u in utterances), to_symbols([u.text for u in utterances], self.cfg.data.frontend)))
        self.vocabulary = build_vocabulary(symbols[u.id] for u in self.utterances["train"])
        train_frames = torch.cat([mels[u.id] for u in self.utterances["train"]])  # [frames, n_mels]
        self.mel_mean = train_frames.mean(dim=0)
        self.mel_std = train_frames.std(dim=0).clamp(min=1e-3)  # a band that never moves is only centred
        train_symbols = sum(len(encode(symbols[u.id], self.vocabulary)) for u in self.utterances["train"])
        self.frames_per_symbol = len(train_frames) / train_symbols
        for split, items in self.utterances.items():
            self.datasets[split] = TTSDataset(
                [encode(symbols[u.id], self.vocabulary) for u in items],
                [(mels[u.id] - self.mel_mean) / self.mel_std for u in items],
            )
        # (tokens, frames) of the longest utterances: the maxima of compiled runs' batch lengths
        self.longest = tuple(max(len(x) for data in self.datasets.values() for x in getattr(data, name))
                             for name in ("tokens", "mels"))

    def spec(self) -> dict:
        """What the model needs, computed from the training split: JSON-serialisable.
        Reads the data first (building the default), so bad input fails before training."""
        self.prepare_data()
        self.setup("fit")
        m = self.mel
        return {
            "vocabulary": self.vocabulary,
            "mel_mean": self.mel_mean.tolist(),
            "mel_std": self.mel_std.tolist(),
            "frames_per_symbol": self.frames_per_symbol,
            "mel": {"sample_rate": m.sample_rate, "n_fft": m.n_fft, "hop_length": m.hop_length, "n_mels": m.n_mels,
                    "f_min": m.f_min, "f_max": m.f_max},
        }

    def collate_fn(self, fixed: bool = False):
        """`fixed`: batches padded to powers of two up to the longest utterance of the
        splits (tokens and frames; TTS has no configured maximum)."""
        return functools.partial(collate, maxima=self.longest) if fixed else collate
