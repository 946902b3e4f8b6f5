"""Summarization data: the Multi-News layout or JSON lines -> token caches -> (source, target) pairs.

Layouts of `data.path` (a folder), chosen by `data.format`:
- `multi_news`: `{train,val,test}.src` and `.tgt`, one example per line, the line's
  documents joined by `|||||` and newlines inside a text written as the token
  `NEWLINE_CHAR` (as in the distributed Multi-News files);
- `jsonl`: `{train,val,test}.jsonl`, one JSON object per line with the source under
  `data.source_key` (a string, or a list of documents) and the summary under
  `data.target_key` (a string); blank lines are skipped.
`data.path: ""` writes the embedded default (tasks/summarization/corpus.py) once to
`<run.dir>/data/` in the Multi-News layout, and the same reader loads it.

The model's source text is the line's documents, each stripped, joined by
`SEPARATOR`. Sources and targets are tokenized once per split into `data.token_cache`
(default `<run.dir>/tokens`) as two streams, each text followed by the end id, and
memory-mapped from there (lavo_tasks.text.token_cache); an example's tokens are found by
the end ids. Truncation happens when an example is read, so the cache serves every
`data.max_source_len` / `data.max_target_len`: the source keeps its first
max_source_len tokens, the target its first max_target_len - 1 followed by the end id.
The decoder reads [end id] + target[:-1] and predicts the target.

Test items also carry the source and the reference summary as text, decoded from their
untruncated tokens: the original text for the byte and trained BPE tokenizers; a given
tokenizer.json that normalises (lowercasing, say) gives its normalised text.
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from lavo_tasks.data import ShardSampler, StepBatchSampler
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.files import write_atomically
from lavo_tasks.text.token_cache import MappedStream, cached_token_stream, file_source
from lavo_tasks.text.tokenizer import build_tokenizer, tokenizer_spec

SPLITS = ("train", "val", "test")
FORMATS = ("multi_news", "jsonl")
DOCUMENT_SEPARATOR = "|||||"
SEPARATOR = f" {DOCUMENT_SEPARATOR} "  # between the documents of a model's source text
NEWLINE_TOKEN = "NEWLINE_CHAR"
# Part of the token cache's key: bump when what a line yields changes.
_READER_VERSION = "summarization-reader-1"


# -- the on-disk layouts -----------------------------------------------------------------

def split_files(path: Path, fmt: str) -> dict[str, tuple[Path, ...]]:
    """The files of each split: (src, tgt) for multi_news, (jsonl,) for jsonl. Only
    that they exist is checked here; no file is read."""
    if not path.is_dir():
        raise DataError(f"data.path={path}: must be a folder of {{train,val,test}}.src/.tgt (multi_news) or .jsonl")
    suffixes = (".src", ".tgt") if fmt == "multi_news" else (".jsonl",)
    files = {split: tuple(path / f"{split}{suffix}" for suffix in suffixes) for split in SPLITS}
    for paths in files.values():
        for file in paths:
            if not file.is_file():
                raise DataError(f"{file}: missing; data.format={fmt} needs {{train,val,test}}{'/'.join(suffixes)}")
    return files


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, text without the line break) of a UTF-8 file."""
    with open(file, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{file}: line {number}: not UTF-8 (invalid byte at column {err.start + 1})") from None


def count_lines(file: Path) -> int:
    with open(file, "rb") as f:
        return sum(1 for _ in f)


def join_documents(documents: list[str]) -> str:
    return SEPARATOR.join(documents)


def multi_news_documents(line: str) -> list[str]:
    """A Multi-News source line -> its documents (empty pieces, such as the one after a
    trailing separator, dropped)."""
    pieces = (piece.replace(NEWLINE_TOKEN, "\n").strip() for piece in line.split(DOCUMENT_SEPARATOR))
    return [piece for piece in pieces if piece]


def multi_news_summary(line: str) -> str:
    return line.replace(NEWLINE_TOKEN, "\n").strip()


def read_multi_news(file: Path, side: str) -> Iterator[str]:
    """The model's texts of a .src (side "source") or .tgt ("target") file, in line order."""
    for number, line in _lines(file):
        text = join_documents(multi_news_documents(line)) if side == "source" else multi_news_summary(line)
        if not text:
            raise DataError(f"{file}: line {number}: empty {side} (every line must hold one example)")
        yield text


def read_jsonl(file: Path, key: str, side: str) -> Iterator[str]:
    """The model's texts under `key` of a JSON-lines file: a source is a string or a list
    of documents (joined by the separator), a target a string."""
    for number, line in _lines(file):
        if not line.strip():
            continue
        where = f"{file}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if key not in record:
            raise DataError(f"{where}: no key {key!r} (data.{side}_key); the object has: {', '.join(record) or 'nothing'}")
        value = record[key]
        if side == "source" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            text = join_documents([v.strip() for v in value if v.strip()])
        elif isinstance(value, str):
            text = value.strip()
        else:
            allowed = "a string or a list of strings" if side == "source" else "a string"
            raise DataError(f"{where}: key {key!r} holds {type(value).__name__}; expected {allowed}")
        if not text:
            raise DataError(f"{where}: key {key!r}: empty {side}")
        yield text


def write_multi_news(folder: Path, split: str, examples: list[tuple[list[str], str]]) -> None:
    """Write (documents, summary) pairs as `<split>.src` / `<split>.tgt` in the Multi-News
    layout (newlines as NEWLINE_CHAR)."""
    folder.mkdir(parents=True, exist_ok=True)

    def line(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\n", f" {NEWLINE_TOKEN} ") + "\n"

    src = "".join(line(f" {DOCUMENT_SEPARATOR} ".join(docs)) for docs, _ in examples).encode("utf-8")
    tgt = "".join(line(summary) for _, summary in examples).encode("utf-8")
    write_atomically(folder / f"{split}.src", lambda f: f.write(src))
    write_atomically(folder / f"{split}.tgt", lambda f: f.write(tgt))


# -- examples from the token streams -----------------------------------------------------

def text_bounds(stream: MappedStream, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) [N] of the texts of a stream in which each text is followed by the end id."""
    ends = (stream.tensor == eos_id).nonzero().squeeze(1)
    starts = torch.cat([ends.new_zeros(1), ends[:-1] + 1])
    return starts, ends


class SummaryPairs(Dataset):
    """Example i: {"source": [S] long, "target": [T] long (ends with the end id)}, truncated
    as the module docstring says; with `tokenizer`, also "source_text" and "reference"."""

    def __init__(self, source: MappedStream, target: MappedStream, eos_id: int, max_source_len: int,
                 max_target_len: int, tokenizer=None):
        self.source, self.target, self.eos_id = source, target, eos_id
        self.max_source_len, self.max_target_len = max_source_len, max_target_len
        self.source_bounds = text_bounds(source, eos_id)
        self.target_bounds = text_bounds(target, eos_id)
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.source_bounds[0])

    def __getitem__(self, i: int) -> dict:
        s0, s1 = int(self.source_bounds[0][i]), int(self.source_bounds[1][i])
        t0, t1 = int(self.target_bounds[0][i]), int(self.target_bounds[1][i])
        source = self.source[s0:min(s1, s0 + self.max_source_len)].long()
        target = self.target[t0:min(t1, t0 + self.max_target_len - 1)].long()
        item = {"source": source, "target": torch.cat([target, target.new_full((1,), self.eos_id)])}
        if self.tokenizer is not None:
            item["source_text"] = self.tokenizer.decode(self.source[s0:s1].tolist())
            item["reference"] = self.tokenizer.decode(self.target[t0:t1].tolist())
        return item


def collate(items: list[dict], eos_id: int) -> dict:
    """Pad to the batch's longest: source [B, S], source_mask [B, S] (True = real),
    decoder_input / target / target_mask [B, T]; texts as lists when the items have them.
    The padding and the decoder's start token are the end id (padding is masked)."""
    def pad(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.full((len(seqs), max(len(s) for s in seqs)), eos_id, dtype=torch.long)
        mask = torch.zeros(out.shape, dtype=torch.bool)
        for row, s in enumerate(seqs):
            out[row, :len(s)], mask[row, :len(s)] = s, True
        return out, mask

    source, source_mask = pad([item["source"] for item in items])
    target, target_mask = pad([item["target"] for item in items])
    start = torch.full((len(items), 1), eos_id, dtype=torch.long)
    batch = {"source": source, "source_mask": source_mask, "target": target, "target_mask": target_mask,
             "decoder_input": torch.cat([start, target[:, :-1]], dim=1)}
    for key in ("source_text", "reference"):
        if key in items[0]:
            batch[key] = [item[key] for item in items]
    return batch


class SummarizationDataModule(L.LightningDataModule):
    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = None
        self.streams: dict[str, tuple[MappedStream, MappedStream]] = {}

    def data_folder(self) -> Path:
        """data.path, or the embedded default's folder (written there first if missing)."""
        if self.cfg.data.path:
            return Path(self.cfg.data.path)
        if not self.cfg.run.dir:
            raise ConfigError("run.dir is empty: the embedded default (data.path='') is written under <run.dir>/data/")
        from .corpus import write_default_dataset  # only the default needs the stdlib corpus

        folder = Path(self.cfg.run.dir) / "data"
        write_default_dataset(folder)
        return folder

    def prepare_data(self) -> None:
        self.data_folder()

    def setup(self, stage: str | None = None) -> None:
        """Read (if the cache misses), tokenize and check every split, once."""
        if self.tokenizer is not None:
            return
        data = self.cfg.data
        fmt = data.format if data.path else "multi_news"
        files = split_files(self.data_folder(), fmt)
        readers = {split: self._readers(fmt, paths) for split, paths in files.items()}
        counts = {split: [count_lines(p) for p in paths] for split, paths in files.items()}
        for split, paths in files.items():
            if counts[split][0] == 0:
                raise DataError(f"{paths[0]}: empty; every split needs at least one example")
            if len(set(counts[split])) > 1:
                (src, tgt), (n_src, n_tgt) = paths, counts[split]
                raise DataError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: one example per line in both")

        run_dir = Path(self.cfg.run.dir)
        train_source, train_target = readers["train"]

        def training_texts():
            yield from train_source()
            yield from train_target()

        self.tokenizer = build_tokenizer(data, training_texts(), run_dir)
        cache = Path(data.token_cache) if data.token_cache else run_dir / "tokens"
        for split, paths in files.items():
            sources = [_READER_VERSION, fmt, *(file_source(p) for p in paths)]
            if fmt == "jsonl":
                sources += [data.source_key, data.target_key]
            source, target = (
                cached_token_stream(f"{split}-{side}", [side, *sources], texts, counts[split][0], self.tokenizer, cache)
                for side, texts in zip(("source", "target"), readers[split])
            )
            self._check_counts(split, paths, source, target)
            self.streams[split] = (source, target)

    def _readers(self, fmt: str, paths: tuple[Path, ...]) -> tuple[Callable, Callable]:
        """(source texts, target texts) of a split, each a function that reads them anew."""
        if fmt == "multi_news":
            src, tgt = paths
            return (lambda: read_multi_news(src, "source")), (lambda: read_multi_news(tgt, "target"))
        (file,) = paths
        data = self.cfg.data
        return (lambda: read_jsonl(file, data.source_key, "source")), (lambda: read_jsonl(file, data.target_key, "target"))

    def _check_counts(self, split: str, paths: tuple[Path, ...], source: MappedStream, target: MappedStream) -> None:
        """As many sources as targets (the end id ends each text, so a text that encodes to
        the end id itself, a literal end token under a BPE, would show up here)."""
        eos = self.tokenizer.eos_id
        n_source, n_target = (int((s.tensor == eos).sum()) for s in (source, target))
        if n_source == 0:
            raise DataError(f"{', '.join(map(str, paths))}: no examples in the {split} split")
        if n_source != n_target:
            raise DataError(
                f"{', '.join(map(str, paths))}: {n_source} source and {n_target} target texts after tokenizing; "
                f"a text that contains the tokenizer's end token splits in two"
            )

    def spec(self) -> dict:
        """What the model needs: vocabulary size, end id and the tokenizer (as
        `lavo_tasks.text.tokenizer.tokenizer_spec` writes it). Reads and tokenizes the splits
        first, so bad data fails before training."""
        if self.tokenizer is None:
            self.prepare_data()
            self.setup("fit")
        return {"vocab_size": self.tokenizer.vocab_size, "eos_id": self.tokenizer.eos_id,
                "tokenizer": tokenizer_spec(self.tokenizer)}

    def dataset(self, split: str, texts: bool = False) -> SummaryPairs:
        source, target = self.streams[split]
        data = self.cfg.data
        return SummaryPairs(source, target, self.tokenizer.eos_id, data.max_source_len, data.max_target_len,
                            tokenizer=self.tokenizer if texts else None)

    def _collate(self, items: list[dict]) -> dict:
        return collate(items, self.tokenizer.eos_id)

    def train_dataloader(self) -> DataLoader:
        pairs = self.dataset("train")
        start_step = self.trainer.global_step if self.trainer is not None else 0
        sampler = StepBatchSampler(len(pairs), self.cfg.data.batch_size, self.cfg.seed, start_step=start_step)
        return DataLoader(pairs, batch_sampler=sampler, collate_fn=self._collate, num_workers=self.cfg.data.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset("val"), batch_size=self.cfg.data.batch_size, shuffle=False,
                          collate_fn=self._collate, num_workers=self.cfg.data.num_workers)

    def test_dataloader(self) -> DataLoader:
        """Each process reads its own share of the test examples (ShardSampler; the
        module's metrics sum over the processes)."""
        pairs = self.dataset("test", texts=True)
        return DataLoader(pairs, batch_size=self.cfg.data.batch_size, sampler=ShardSampler(len(pairs)), shuffle=False,
                          collate_fn=self._collate, num_workers=self.cfg.data.num_workers)
