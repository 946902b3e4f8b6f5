"""Summarization data: the Multi-News layout or JSON lines -> token caches -> (source, target) pairs.

`data.path` is a folder in one of the layouts of formats.py, chosen by `data.format`.
`data.path: ""` reads the embedded default (corpus.py), written once per machine in the
Multi-News layout into the default-data cache (lavo_tasks.default_data).

Sources and targets are tokenized once per split into `data.token_cache`
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

import functools
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from lavo_tasks.data import TaskDataModule, pad_batch
from lavo_tasks.errors import DataError
from lavo_tasks.text.token_cache import MappedStream, cached_token_stream, file_source
from lavo_tasks.text.tokenizer import build_tokenizer, tokenizer_spec

from . import corpus
from .formats import count_lines, read_jsonl, read_multi_news, split_files

# Part of the token cache's key: bump when what a line yields changes.
_READER_VERSION = "summarization-reader-1"


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


def collate(items: list[dict], eos_id: int, maxima: tuple[int, int] | None = None) -> dict:
    """Pad to the batch's longest, or with `maxima` (source, target) to its bucket
    (lavo_tasks.data.bucket_length): source [B, S], source_mask [B, S] (True = real),
    decoder_input / target / target_mask [B, T]; texts as lists when the items have them.
    The padding and the decoder's start token are the end id (padding is masked)."""
    source_max, target_max = maxima or (None, None)
    source, source_mask = pad_batch([item["source"] for item in items], eos_id, source_max)
    target, target_mask = pad_batch([item["target"] for item in items], eos_id, target_max)
    start = torch.full((len(items), 1), eos_id, dtype=torch.long)
    batch = {"source": source, "source_mask": source_mask, "target": target, "target_mask": target_mask,
             "decoder_input": torch.cat([start, target[:, :-1]], dim=1)}
    for key in ("source_text", "reference"):
        if key in items[0]:
            batch[key] = [item[key] for item in items]
    return batch


class SummarizationDataModule(TaskDataModule):
    """Tokenizes the splits in `setup`: `self.tokenizer`, `self.streams[split]` (source,
    target) and `self.datasets[split]`, SummaryPairs (the test's with the texts)."""

    default_name = "multi_news"

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.tokenizer = None
        self.streams: dict[str, tuple[MappedStream, MappedStream]] = {}

    def default_recipe(self) -> dict:
        return corpus.recipe()

    def write_default(self, path: Path) -> None:
        corpus.write_default_dataset(path)

    def setup(self, stage: str | None = None) -> None:
        """Read (if the cache misses), tokenize and check every split, once."""
        if self.tokenizer is not None:
            return
        data = self.cfg.data
        fmt = data.format if data.path else "multi_news"
        files = split_files(self.data_path(), fmt)
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
            self.datasets[split] = self.dataset(split, texts=split == "test")

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

    def collate_fn(self, fixed: bool = False) -> Callable:
        """`fixed`: batches padded to powers of two up to data.max_source_len and max_target_len."""
        maxima = (self.cfg.data.max_source_len, self.cfg.data.max_target_len) if fixed else None
        return functools.partial(collate, eos_id=self.tokenizer.eos_id, maxima=maxima)
