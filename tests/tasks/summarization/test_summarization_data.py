"""Summarization data: the Multi-News and JSON-lines layouts, truncation, batches, the token
cache, the embedded default and every bad input."""

import json

import pytest
import torch

from lavo_tasks.config import compose, validate
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.tasks import summarization
from lavo_tasks.tasks.summarization import corpus
from lavo_tasks.tasks.summarization import data as sdata
from lavo_tasks.tasks.summarization import formats

EOS = 256  # the byte tokenizer's end id


def tiny_cfg(tmp_path, *extra):
    cfg = compose([
        "task=summarization", "attention=softmax", "model.d_model=16", "model.n_heads=2",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_ff=32", "data.batch_size=2", "data.tokenizer=byte",
        f"run.dir={tmp_path / 'run'}", *extra,
    ])
    validate(cfg)
    return cfg


def write_multi_news(folder, splits):
    """splits: {split: (src text, tgt text)} written verbatim; the other splits get one example."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in formats.SPLITS:
        src, tgt = splits.get(split, ("a document ||||| another one\n", "a summary\n"))
        (folder / f"{split}.src").write_bytes(src.encode() if isinstance(src, str) else src)
        (folder / f"{split}.tgt").write_bytes(tgt.encode() if isinstance(tgt, str) else tgt)
    return folder


def loaded(cfg):
    dm = summarization.DataModule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def ids(text):
    return list(text.encode())


def test_multi_news_lines_become_documents_joined_by_the_separator(tmp_path):
    folder = write_multi_news(tmp_path / "mn", {"train": (
        "First doc. NEWLINE_CHAR NEWLINE_CHAR Its second line. ||||| Second doc é ||||| \n"
        "Only one document\n",
        "– A summary NEWLINE_CHAR over two lines\nShort\n",
    )})
    dm = loaded(tiny_cfg(tmp_path, f"data.path={folder}"))
    train = dm.dataset("train", texts=True)
    assert len(train) == 2
    first = "First doc. \n \n Its second line. ||||| Second doc é"  # pieces stripped, trailing separator dropped
    assert train[0]["source_text"] == first and train[0]["source"].tolist() == ids(first)
    assert train[0]["reference"] == "– A summary \n over two lines"
    assert train[0]["target"].tolist() == ids("– A summary \n over two lines") + [EOS]
    assert train[1]["source_text"] == "Only one document" and train[1]["reference"] == "Short"
    assert dm.spec() == {"vocab_size": 257, "eos_id": EOS, "tokenizer": "byte"}


def test_jsonl_strings_lists_and_other_keys(tmp_path):
    folder = tmp_path / "js"
    folder.mkdir()
    rows = [{"text": ["doc one ", "", "doc two"], "abstract": " sum one "}, {"text": "a whole source", "abstract": "s2"}]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a blank line is skipped
    for split in ("val", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps(rows[1]) + "\n")
    cfg = tiny_cfg(tmp_path, f"data.path={folder}", "data.format=jsonl", "data.source_key=text",
                   "data.target_key=abstract")
    train = loaded(cfg).dataset("train", texts=True)
    assert [(x["source_text"], x["reference"]) for x in (train[0], train[1])] == [
        ("doc one ||||| doc two", "sum one"), ("a whole source", "s2")]


def test_truncation_and_batches(tmp_path):
    folder = write_multi_news(tmp_path / "mn", {"train": ("abcdefgh\nxy\n", "12345\n9\n")})
    dm = loaded(tiny_cfg(tmp_path, f"data.path={folder}", "data.max_source_len=4", "data.max_target_len=3"))
    pairs = dm.dataset("train")
    assert pairs[0]["source"].tolist() == ids("abcd") and pairs[0]["target"].tolist() == ids("12") + [EOS]
    assert pairs[1]["source"].tolist() == ids("xy") and pairs[1]["target"].tolist() == ids("9") + [EOS]
    batch = sdata.collate([pairs[0], pairs[1]], EOS)
    assert batch["source"].tolist() == [ids("abcd"), ids("xy") + [EOS, EOS]]
    assert batch["source_mask"].tolist() == [[True] * 4, [True, True, False, False]]
    assert batch["target"].tolist() == [ids("12") + [EOS], ids("9") + [EOS, EOS]]
    assert batch["target_mask"].tolist() == [[True] * 3, [True, True, False]]
    assert batch["decoder_input"].tolist() == [[EOS] + ids("12"), [EOS] + ids("9") + [EOS]]
    train_batch = next(iter(dm.train_dataloader()))
    assert train_batch["source"].shape[0] == 2 and "reference" not in train_batch


def test_splits_come_from_the_token_cache_and_a_later_run_reads_no_text(tmp_path, monkeypatch):
    folder = write_multi_news(tmp_path / "mn", {"train": ("one ||||| two\nthree\n", "s1\ns2\n")})
    cache = tmp_path / "tokens"
    first = loaded(tiny_cfg(tmp_path / "a", f"data.path={folder}", f"data.token_cache={cache}"))
    assert len(list(cache.glob("*.bin"))) == 6  # source and target of three splits

    def no_reading(*args):
        raise AssertionError("a text file was read although its tokens are cached")

    monkeypatch.setattr(sdata, "read_multi_news", no_reading)
    second = loaded(tiny_cfg(tmp_path / "b", f"data.path={folder}", f"data.token_cache={cache}"))
    for split in formats.SPLITS:
        for a, b in zip(first.streams[split], second.streams[split]):
            assert torch.equal(a.tensor, b.tensor)


def test_bpe_trained_on_the_training_split(tmp_path):
    words = "the model reads many documents and writes a short summary of them "
    folder = write_multi_news(tmp_path / "mn", {"train": ((words * 3 + "\n") * 20, (words + "\n") * 20)})
    dm = loaded(tiny_cfg(tmp_path, f"data.path={folder}", "data.tokenizer=bpe", "data.vocab_size=300"))
    spec = dm.spec()
    assert spec["vocab_size"] == 300 and spec["tokenizer"] != "byte"
    item = dm.dataset("train", texts=True)[0]
    assert len(item["source"]) < len(words * 3) / 2  # merges learnt from the training texts
    assert item["source_text"] == (words * 3).strip() and item["reference"] == words.strip()


# -- bad input: one line naming the file, line, key or value -----------------------------

@pytest.mark.parametrize("splits, message", [
    ({"val": ("a\nb\nc\n", "x\ny\n")}, r"val.src has 3 lines but .*val.tgt has 2: one example per line"),
    ({"train": ("a\n\nc\n", "x\ny\nz\n")}, r"train.src: line 2: empty source"),
    ({"train": ("a\n ||||| NEWLINE_CHAR \n", "x\ny\n")}, r"train.src: line 2: empty source"),
    ({"test": ("a\nb\n", "x\n \n")}, r"test.tgt: line 2: empty target"),
    ({"test": ("a\n", b"caf\xe9\n")}, r"test.tgt: line 1: not UTF-8 \(invalid byte at column 4\)"),
    ({"val": ("", "")}, r"val.src: empty; every split needs at least one example"),
])
def test_bad_multi_news_files(tmp_path, splits, message):
    folder = write_multi_news(tmp_path / "mn", splits)
    with pytest.raises(DataError, match=message):
        loaded(tiny_cfg(tmp_path, f"data.path={folder}"))


@pytest.mark.parametrize("line, message", [
    ('{"document": "a", "summary": "b"', r"train.jsonl: line 2: not valid JSON \(Expecting ',' delimiter at column 33\)"),
    ('{"document": "a", "summary": "b', r"train.jsonl: line 2: not valid JSON \(Unterminated string starting at column 30\)"),
    ('{"document": "a"}', r"train.jsonl: line 2: no key 'summary' \(data.target_key\); the object has: document"),
    ('{"summary": "b"}', r"train.jsonl: line 2: no key 'document' \(data.source_key\)"),
    ('["a", "b"]', r"train.jsonl: line 2: expected a JSON object, got list"),
    ('{"document": 3, "summary": "b"}', r"line 2: key 'document' holds int; expected a string or a list of strings"),
    ('{"document": "a", "summary": " "}', r"train.jsonl: line 2: key 'summary': empty target"),
])
def test_bad_jsonl_lines(tmp_path, line, message):
    folder = tmp_path / "js"
    folder.mkdir()
    good = '{"document": "x", "summary": "y"}'
    (folder / "train.jsonl").write_text(f"{good}\n{line}\n")
    for split in ("val", "test"):
        (folder / f"{split}.jsonl").write_text(good + "\n")
    with pytest.raises(DataError, match=message):
        loaded(tiny_cfg(tmp_path, f"data.path={folder}", "data.format=jsonl"))


def test_config_errors_before_any_work(tmp_path):
    folder = write_multi_news(tmp_path / "mn", {})
    (folder / "test.tgt").unlink()
    with pytest.raises(DataError, match=r"mn/test.tgt: missing; data.format=multi_news needs \{train,val,test\}.src/.tgt"):
        tiny_cfg(tmp_path, f"data.path={folder}")
    with pytest.raises(DataError, match=r"mn/train.jsonl: missing"):
        tiny_cfg(tmp_path, f"data.path={folder}", "data.format=jsonl")
    for key, value, message in [
        ("data.max_source_len", 0, r"data.max_source_len=0: must be >= 1"),
        ("data.max_target_len", 1, r"data.max_target_len=1: must be >= 2"),
        ("data.format", "csv", r"data.format='csv': must be one of multi_news, jsonl"),
        ("decode.beam", 0, r"decode.beam=0: must be >= 1"),
        ("decode.min_len", 500, r"decode.min_len=500: must be in \[0, decode.max_len=192\]"),
        ("loss.label_smoothing", 1, r"loss.label_smoothing=1: must be in \[0, 1\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            tiny_cfg(tmp_path, f"{key}={value}")
    # the default's cross site is NC (model.cross_causal=false)
    with pytest.raises(ConfigError, match=r"attention 'local' does not support noncausal cross-attention \(NC\)"):
        tiny_cfg(tmp_path, "attention=local")


# -- the embedded default -----------------------------------------------------------------

def test_default_examples_are_multi_document_and_the_summary_is_each_first_sentence():
    examples = corpus.default_examples()
    assert len(examples["train"]) > 1000 and len(examples["val"]) > 50 and len(examples["test"]) > 30
    documents = {split: {doc for docs, _ in exs for doc in docs} for split, exs in examples.items()}
    assert not documents["train"] & documents["val"] and not documents["train"] & documents["test"]
    assert not documents["val"] & documents["test"]
    lead_is_summary = 0
    for documents, summary in examples["train"] + examples["test"]:
        assert corpus.MIN_DOCUMENTS <= len(documents) <= corpus.MAX_DOCUMENTS
        assert len(formats.join_documents(documents)) <= corpus.SOURCE_CHARS or len(documents) == corpus.MIN_DOCUMENTS
        firsts = [corpus.sentences(d)[0] for d in documents]
        assert summary == " ".join(firsts)
        assert all(len(corpus.sentences(d)) >= 2 for d in documents)  # a document is more than its summary
        words = summary.split()
        lead_is_summary += " ".join(documents).split()[:len(words)] == words
    assert lead_is_summary == 0  # the first words of the source never are the summary


def test_sentences_split_at_an_end_mark_before_a_capital():
    assert corpus.sentences("Return x.  See  also\nY. e.g. this! Why? no") == ["Return x.", "See also Y. e.g. this!",
                                                                               "Why? no"]
    assert corpus.document_of("One sentence only.") is None
    assert corpus.document_of("Too short. Second one.") is None  # first sentence under 3 words
    assert corpus.document_of("Return the value of x. It is cached. " + "Long " * 60 + "tail.") == [
        "Return the value of x.", "It is cached."]


def test_the_default_is_written_once_in_the_multi_news_layout(tmp_path):
    cfg = tiny_cfg(tmp_path)
    dm = loaded(cfg)
    folder = dm.data_path()
    assert not (tmp_path / "run" / "data").exists()  # in the default-data cache, not the run folder
    examples = corpus.default_examples()
    assert (folder / "test.src").read_text().count("\n") == len(examples["test"])
    test = dm.dataset("test", texts=True)
    assert len(test) == len(examples["test"])
    assert test[0]["source_text"] == formats.join_documents(examples["test"][0][0])
    assert test[0]["reference"] == examples["test"][0][1]
    mtime = (folder / "train.src").stat().st_mtime_ns
    again = loaded(tiny_cfg(tmp_path / "second"))  # another run reads the same build
    assert again.data_path() == folder and (folder / "train.src").stat().st_mtime_ns == mtime
