"""Tokenized text splits on disk: tokenize once, then memory-map.

`cached_token_stream` returns a split's token stream (every document's ids, each followed
by the end-of-document id) as a `MappedStream`: a 1-D integer tensor backed by a file
that the OS pages in as it is read, so a split of billions of tokens (PG-19's training
books) is neither held in memory nor tokenized again by a later run. The file is reused
while its key matches: a hash of the tokenizer (its JSON, vocabulary size and
end-of-document id) and of the sources (each file's resolved path, inode, size,
modification and change times, or, for texts that come from memory, the texts
themselves). Bump FORMAT when what a source yields changes (how files are decoded, the
layout of the stream).

Layout of the cache folder, per split: `<name>-<key>.bin`, the ids as little-endian
uint16 (vocabularies up to 65,536) or int32, and `<name>-<key>.json` (format, dtype,
token count, tokenizer and sources), written last. Both go through
`files.write_atomically`, so a crash, or several processes (of one machine or of several
sharing the folder) writing at once, never leave a partial file that a reader would
take; processes that miss the cache at the same time each tokenize. Streams of
older keys are not deleted.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..files import write_atomically

FORMAT = 1
_UINT16_VOCAB = 1 << 16


def file_source(path: Path) -> list:
    """What identifies a text file's contents without reading it: resolved path, inode,
    size, modification and change times (ns; the change time cannot be set back, as
    `cp -p` or `touch -r` set the modification time)."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def text_source(texts: Iterable[str]) -> str:
    """What identifies texts held in memory: the sha256 of their contents."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def tokenizer_id(tokenizer) -> list:
    """A tokenizer's identity: its kind, vocabulary size and end-of-document id, and for a
    `tokenizers` file the sha256 of its JSON."""
    to_json = getattr(tokenizer, "to_json", None)
    digest = hashlib.sha256(to_json().encode("utf-8")).hexdigest() if to_json is not None else None
    return [type(tokenizer).__name__, tokenizer.vocab_size, tokenizer.eos_id, digest]


_TORCH_DTYPES = {"<u2": torch.uint16, "<i4": torch.int32}


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= _UINT16_VOCAB else np.dtype("<i4")


class MappedStream:
    """Tokens [start, stop) of a cached stream file, mapped read-only on first use in each
    process. It pickles as its file name and bounds, so DataLoader workers started by
    spawn or forkserver map the file themselves (a file-mapped tensor cannot be sent
    through PyTorch's shared-memory pickling: it fails, or copies the whole split).

    Indexing (`stream[a:b]`) returns tensors of the file's dtype; `tensor` is the whole
    range."""

    def __init__(self, path: Path, dtype: str, start: int, stop: int):
        self.path, self.dtype, self.start, self.stop = path, dtype, start, stop
        self._tensor = None

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            whole = torch.from_file(str(self.path), shared=False, size=self.stop, dtype=_TORCH_DTYPES[self.dtype])
            self._tensor = whole[self.start :]
        return self._tensor

    def head(self, n: int) -> "MappedStream":
        """The first n tokens."""
        return MappedStream(self.path, self.dtype, self.start, min(self.start + n, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index) -> torch.Tensor:
        return self.tensor[index]

    def tolist(self) -> list[int]:
        return self.tensor.tolist()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tensor": None}


def cached_token_stream(
    name: str, sources: list, documents: Callable[[], Iterable[str]], count: int, tokenizer, folder: Path
) -> MappedStream:
    """Split `name`'s token stream [N] (uint16 or int32), memory-mapped from `folder`.

    sources: what identifies the split's texts (`file_source` / `text_source` values);
    documents: returns the texts in order (called only to tokenize, so files are read
    only when the cache has no valid stream); count: how many there are (for the
    progress bar)."""
    dtype = token_dtype(tokenizer.vocab_size)
    header = {"format": FORMAT, "dtype": dtype.str, "tokenizer": tokenizer_id(tokenizer), "sources": sources}
    key = hashlib.sha256(json.dumps(header, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    data, meta = folder / f"{name}-{key}.bin", folder / f"{name}-{key}.json"
    tokens = _valid_count(data, meta, header, dtype)
    if tokens is None:
        folder.mkdir(parents=True, exist_ok=True)
        tokens = _tokenize(documents(), count, tokenizer, dtype, data, f"tokenizing {name}")
        payload = json.dumps({**header, "tokens": tokens}, indent=1).encode("utf-8")
        write_atomically(meta, lambda f: f.write(payload))
    return MappedStream(data, dtype.str, 0, tokens)


def _valid_count(data: Path, meta: Path, header: dict, dtype: np.dtype) -> int | None:
    """The token count of a cached stream that matches `header` and whose file has the
    size the count says; None if there is none."""
    try:
        saved = json.loads(meta.read_text(encoding="utf-8"))
        size = data.stat().st_size
    except (OSError, ValueError):
        return None
    tokens = saved.pop("tokens", None) if isinstance(saved, dict) else None
    if saved != header or not isinstance(tokens, int) or tokens <= 0 or size != tokens * dtype.itemsize:
        return None
    return tokens


def _tokenize(documents: Iterable[str], count: int, tokenizer, dtype: np.dtype, data: Path, desc: str) -> int:
    """Encodes the documents into `data` (each followed by the end-of-document id) -> how
    many tokens were written."""
    tokens = 0

    def write(f):
        nonlocal tokens
        for text in tqdm(documents, total=count, desc=desc, unit="doc", disable=None, leave=False):
            ids = np.asarray(tokenizer.encode(text) + [tokenizer.eos_id], dtype=dtype)
            ids.tofile(f)
            tokens += len(ids)

    write_atomically(data, write)  # an unreadable text or an interrupt leaves no file behind
    return tokens
