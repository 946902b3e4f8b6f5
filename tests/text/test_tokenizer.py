"""Tokenizers: byte-level, BPE trained on a text the test writes, a given tokenizer.json."""

import json

import pytest
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers

from lavo_tasks.errors import ConfigError
from lavo_tasks.text.tokenizer import (
    EOS_TOKEN,
    TOKENIZER_FILE,
    ByteTokenizer,
    build_tokenizer,
    check_tokenizer_keys,
    tokenizer_from_spec,
    tokenizer_spec,
    train_bpe,
)

SAMPLE = "Grüße, naïve café — ok?\n\tTabs, 😀 emoji and  two spaces."
TRAIN_TEXT = [
    "the cat sat on the mat. the cat ate the rat. " * 20,
    "a theory of the thermal theme: the thing is there. " * 20,
]


def data_keys(tokenizer: str, vocab_size: int = 300):
    return OmegaConf.create({"tokenizer": tokenizer, "vocab_size": vocab_size})


def test_byte_tokenizer_ids_and_round_trip():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    assert tok.encode("Aé") == [65, 0xC3, 0xA9]  # UTF-8 of é is C3 A9
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
    assert tok.decode([104, 105, 256, 0xE2, 0x82, 0xAC]) == f"hi{EOS_TOKEN}€"
    assert tok.decode([0xC3]) == "\ufffd"  # a cut UTF-8 sequence decodes, replaced


def test_bpe_trained_round_trip_merges_and_reload(tmp_path):
    tok = build_tokenizer(data_keys("bpe", 300), TRAIN_TEXT, tmp_path)
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE  # byte-level: any text round-trips
    assert tok.decode(tok.encode(TRAIN_TEXT[0])) == TRAIN_TEXT[0]
    assert 257 <= tok.vocab_size <= 300
    assert tok.decode([tok.eos_id]) == EOS_TOKEN
    # merges learnt from the text: a frequent phrase takes far fewer ids than bytes
    assert len(tok.encode(" the cat sat on the mat")) <= 8
    # saved to the run folder and, when there, loaded instead of trained again
    assert (tmp_path / TOKENIZER_FILE).is_file()
    again = build_tokenizer(data_keys("bpe", 300), ["completely different text " * 50], tmp_path)
    assert again.encode(TRAIN_TEXT[1]) == tok.encode(TRAIN_TEXT[1])
    assert (again.vocab_size, again.eos_id) == (tok.vocab_size, tok.eos_id)


def write_word_level(path, with_eos: bool):
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "!": 3}
    if with_eos:
        vocab["</s>"] = 4
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if with_eos:
        tok.add_special_tokens(["</s>"])
    tok.save(str(path))


def test_given_tokenizer_json_is_used_and_copied(tmp_path):
    given = tmp_path / "mine.json"
    write_word_level(given, with_eos=True)
    run_dir = tmp_path / "run"
    tok = build_tokenizer(data_keys(str(given)), [], run_dir)
    assert tok.encode("hello world !") == [1, 2, 3]
    assert tok.encode("hello moon") == [1, 0]
    assert (tok.eos_id, tok.vocab_size) == (4, 5)  # its own end token is kept
    assert json.loads((run_dir / TOKENIZER_FILE).read_text())["model"]["vocab"]["world"] == 2


def test_given_tokenizer_without_end_token_gets_one(tmp_path):
    given = tmp_path / "plain.json"
    write_word_level(given, with_eos=False)
    tok = build_tokenizer(data_keys(str(given)), [], tmp_path / "run")
    assert tok.eos_id == 4 and tok.vocab_size == 5
    assert tok.decode([tok.eos_id]) == EOS_TOKEN


def test_bad_tokenizer_keys_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"data.tokenizer='wordpiece': allowed: byte, bpe"):
        check_tokenizer_keys(data_keys("wordpiece"))
    with pytest.raises(ConfigError, match=r"data.tokenizer=.*missing.json"):
        check_tokenizer_keys(data_keys(str(tmp_path / "missing.json")))
    with pytest.raises(ConfigError, match=r"data.vocab_size=100: .* at least 257"):
        check_tokenizer_keys(data_keys("bpe", 100))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    check_tokenizer_keys(data_keys(str(broken)))  # exists, so the key check passes ...
    with pytest.raises(ConfigError, match=r"data.tokenizer=.*broken.json.*not a readable tokenizer.json"):
        build_tokenizer(data_keys(str(broken)), [], tmp_path / "run")  # ... reading it does not


def test_a_tokenizer_survives_a_runs_spec():
    texts = ["the quick brown fox jumps over the lazy dog. " * 20, "a lazy dog and a quick fox. " * 10]
    bpe = train_bpe(texts, 300)
    again = tokenizer_from_spec(json.loads(json.dumps(tokenizer_spec(bpe))))  # as spec.json stores it
    sample = "the lazy fox, quick as a dog"
    assert again.encode(sample) == bpe.encode(sample) and again.decode(bpe.encode(sample)) == sample
    assert (again.vocab_size, again.eos_id) == (bpe.vocab_size, bpe.eos_id)
    assert tokenizer_spec(ByteTokenizer()) == "byte" and isinstance(tokenizer_from_spec("byte"), ByteTokenizer)
