"""The summarization datasets' on-disk layouts, read and written (the layouts of `data.path`).

- `multi_news`: `{train,val,test}.src` and `.tgt`, one example per line, the line's
  documents joined by `|||||` and newlines inside a text written as the token
  `NEWLINE_CHAR` (as in the distributed Multi-News files);
- `jsonl`: `{train,val,test}.jsonl`, one JSON object per line with the source under
  `data.source_key` (a string, or a list of documents) and the summary under
  `data.target_key` (a string); blank lines are skipped.

A reader yields the model's texts: a source is the example's documents, each stripped,
joined by `SEPARATOR`. The data module (data.py) reads these layouts and the embedded
default (corpus.py) is written in the Multi-News one.
"""

import json
from collections.abc import Iterator
from pathlib import Path

from lavo_tasks.errors import DataError
from lavo_tasks.files import write_atomically

SPLITS = ("train", "val", "test")
FORMATS = ("multi_news", "jsonl")
DOCUMENT_SEPARATOR = "|||||"
SEPARATOR = f" {DOCUMENT_SEPARATOR} "  # between the documents of a model's source text
NEWLINE_TOKEN = "NEWLINE_CHAR"


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
