"""Tokenized splits on disk (lavo_tasks.text.token_cache): written once, memory-mapped, reused
while texts and tokenizer are unchanged, rebuilt otherwise (the LM data module on top of
it: tests/tasks/lm/test_lm.py)."""

import json
import os
import pickle
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lavo_tasks.tasks.lm.data import TokenWindows
from lavo_tasks.text.token_cache import cached_token_stream, file_source, text_source
from lavo_tasks.text.tokenizer import ByteTokenizer


def byte_stream(*docs):
    """The byte tokenizer's ids of the documents, each followed by its end id 256."""
    return [i for doc in docs for i in [*doc.encode("utf-8"), 256]]


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Calls:
    """documents() for cached_token_stream that counts how often the texts were asked for."""

    def __init__(self, texts):
        self.texts, self.calls = texts, 0

    def __call__(self):
        self.calls += 1
        return iter(self.texts)


def stream(texts, folder, tokenizer=None, sources=None):
    docs = Calls(texts)
    out = cached_token_stream("train", sources or [text_source(texts)], docs, len(texts), tokenizer or ByteTokenizer(), folder)
    return out, docs.calls


def test_stream_is_written_once_then_memory_mapped_from_the_file(tmp_path):
    texts = ["first document", "second, é"]
    got, calls = stream(texts, tmp_path)
    assert calls == 1 and got.tensor.dtype == torch.uint16
    assert got.tolist() == byte_stream(*texts)
    (data,) = tmp_path.glob("train-*.bin")
    assert np.fromfile(data, dtype="<u2").tolist() == byte_stream(*texts)  # the bytes on disk
    meta = json.loads(data.with_suffix(".json").read_text())
    assert meta["tokens"] == len(byte_stream(*texts)) and meta["dtype"] == "<u2"
    again, calls = stream(texts, tmp_path)
    assert calls == 0 and torch.equal(again.tensor, got.tensor)  # reused: the texts were not asked for
    assert not list(tmp_path.glob("*.tmp"))


def test_changed_texts_or_tokenizer_make_a_new_stream(tmp_path):
    stream(["one text"], tmp_path)
    got, calls = stream(["another text"], tmp_path)
    assert calls == 1 and got.tolist() == byte_stream("another text")

    class Shifted(ByteTokenizer):  # another tokenizer, same vocabulary size
        def encode(self, text):
            return [(b + 1) % 256 for b in text.encode("utf-8")]

    got, calls = stream(["another text"], tmp_path, tokenizer=Shifted())
    assert calls == 1 and got.tolist()[:2] == [ord("a") + 1, ord("n") + 1]
    assert len(list(tmp_path.glob("train-*.bin"))) == 3


@pytest.mark.parametrize("edit", ["longer", "same size, modification time put back"])
def test_a_changed_file_is_tokenized_again(tmp_path, edit):
    book = tmp_path / "book.txt"
    write(book, "old text")
    before = book.stat()
    stream([book.read_text()], tmp_path / "cache", sources=[file_source(book)])
    new_text = "new, longer text" if edit == "longer" else "new text"
    time.sleep(0.01)  # a change time the file system can tell apart
    write(book, new_text)
    if edit != "longer":  # as `cp -p` or `touch -r` would leave it
        os.utime(book, ns=(before.st_atime_ns, before.st_mtime_ns))
    got, calls = stream([book.read_text()], tmp_path / "cache", sources=[file_source(book)])
    assert calls == 1 and got.tolist() == byte_stream(new_text)


def test_another_end_of_document_id_makes_a_new_stream(tmp_path):
    stream(["text"], tmp_path)

    class OtherEnd(ByteTokenizer):
        eos_id = 255

    got, calls = stream(["text"], tmp_path, tokenizer=OtherEnd())
    assert calls == 1 and got.tolist()[-1] == 255


def test_a_stream_pickles_as_its_file_and_maps_again_in_spawned_workers(tmp_path):
    texts = ["x" * 5000, "the second document"]
    got, _ = stream(texts, tmp_path)
    assert len(pickle.dumps(got)) < 1000  # the name and bounds, not the tokens
    head = got.head(100)
    assert pickle.loads(pickle.dumps(head)).tolist() == byte_stream(*texts)[:100]
    windows = TokenWindows(got, length=7, stride=7)
    loader = DataLoader(windows, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    batches = torch.cat(list(loader))
    assert batches.dtype == torch.long
    assert batches.tolist() == [byte_stream(*texts)[i * 7 : i * 7 + 8] for i in range(len(windows))]


@pytest.mark.parametrize("damage", ["truncated data", "bad count", "no metadata", "not json"])
def test_a_damaged_cache_is_rebuilt_not_read(tmp_path, damage):
    texts = ["some text to cache"]
    stream(texts, tmp_path)
    (data,) = tmp_path.glob("train-*.bin")
    meta = data.with_suffix(".json")
    if damage == "truncated data":
        data.write_bytes(data.read_bytes()[:-2])
    elif damage == "bad count":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "tokens": 3}))
    elif damage == "no metadata":
        meta.unlink()
    else:
        meta.write_text("{not json")
    got, calls = stream(texts, tmp_path)
    assert calls == 1 and got.tolist() == byte_stream(*texts)


def test_large_vocabularies_are_stored_as_int32(tmp_path):
    class Wide(ByteTokenizer):
        vocab_size, eos_id = 70_000, 69_999

        def encode(self, text):
            return [65_536 + len(text), 3]

    got, _ = stream(["abc"], tmp_path, tokenizer=Wide())
    assert got.tensor.dtype == torch.int32 and got.tolist() == [65_539, 3, 69_999]
