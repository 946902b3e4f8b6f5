"""Text tokenizers shared by the text tasks (`data.tokenizer`, `data.vocab_size`).

- `byte` (default): the UTF-8 bytes, ids 0..255, plus one end-of-document id (256).
- `bpe`: a byte-level BPE trained with the `tokenizers` library on the training split,
  `data.vocab_size` entries including the end-of-document token.
- a path to a `tokenizer.json` (the `tokenizers` format, e.g. from a Hugging Face model);
  if it has no end-of-document token among its special tokens, `<|endoftext|>` is added.

Every tokenizer has the same small interface: `encode(str) -> list[int]`,
`decode(list[int]) -> str`, `vocab_size`, `eos_id` (and, for a `tokenizers` file,
`to_json()`). A trained or given tokenizer is saved as `<run.dir>/tokenizer.json` and
loaded from there when that file exists, so evaluation, resumed runs and generation use
exactly the tokenizer of training.
"""

from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..errors import ConfigError
from ..files import write_atomically

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
# Special tokens that already mean "end of document" in common tokenizer.json files.
_KNOWN_EOS = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>")
_BYTE_ALPHABET = 256


class ByteTokenizer:
    """UTF-8 bytes; id 256 ends a document. Decoding replaces invalid byte sequences
    (a model may generate them) with U+FFFD and writes the end id as `<|endoftext|>`."""

    vocab_size = _BYTE_ALPHABET + 1
    eos_id = _BYTE_ALPHABET

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        pieces, current = [], bytearray()
        for i in ids:
            if i == self.eos_id:
                pieces += [current.decode("utf-8", errors="replace"), EOS_TOKEN]
                current = bytearray()
            else:
                current.append(i)
        pieces.append(current.decode("utf-8", errors="replace"))
        return "".join(pieces)


class FileTokenizer:
    """A `tokenizers.Tokenizer` (trained BPE or a user's tokenizer.json)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        eos = next((name for name in _KNOWN_EOS if name in specials), None)
        if eos is None:
            tokenizer.add_special_tokens([EOS_TOKEN])
            eos = EOS_TOKEN
        self.eos_id = tokenizer.token_to_id(eos)
        # ids may have gaps; the embedding must cover the largest one
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer as the `tokenizers` JSON it saves (what identifies it)."""
        return self._tok.to_str()


def train_bpe(texts: Iterable[str], vocab_size: int) -> FileTokenizer:
    """Byte-level BPE: every byte is in the base alphabet, so any text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return FileTokenizer(tok)


def check_tokenizer_keys(data: DictConfig) -> None:
    """ConfigError for a bad `data.tokenizer` / `data.vocab_size`."""
    kind = data.tokenizer
    if kind == "bpe":
        if data.vocab_size < _BYTE_ALPHABET + 1:
            raise ConfigError(
                f"data.vocab_size={data.vocab_size}: a byte-level BPE needs at least "
                f"{_BYTE_ALPHABET + 1} (256 bytes + the end-of-document token)"
            )
    elif kind != "byte":
        path = Path(kind)
        if path.suffix != ".json" or not path.is_file():
            raise ConfigError(
                f"data.tokenizer={kind!r}: allowed: byte, bpe, or the path of an existing tokenizer.json file"
            )


def build_tokenizer(data: DictConfig, train_texts: Iterable[str], run_dir: Path) -> ByteTokenizer | FileTokenizer:
    """The tokenizer `data.tokenizer` names. For `bpe` and a given file, a
    `run_dir/tokenizer.json` saved earlier wins (same run: same tokenizer); otherwise the
    tokenizer is trained on `train_texts` (bpe) or read, then saved there."""
    if data.tokenizer == "byte":
        return ByteTokenizer()
    saved = run_dir / TOKENIZER_FILE
    if saved.is_file():
        return FileTokenizer(Tokenizer.from_file(str(saved)))
    if data.tokenizer == "bpe":
        tok = train_bpe(train_texts, int(data.vocab_size))
    else:
        try:
            tok = FileTokenizer(Tokenizer.from_file(data.tokenizer))
        except Exception as err:  # the library raises a bare Exception for a bad file
            raise ConfigError(f"data.tokenizer={data.tokenizer!r}: not a readable tokenizer.json ({err})") from None
    run_dir.mkdir(parents=True, exist_ok=True)
    # processes of one multi-GPU run may save the same tokenizer at once
    payload = tok.to_json().encode("utf-8")
    write_atomically(saved, lambda f: f.write(payload))
    return tok


def tokenizer_spec(tokenizer: ByteTokenizer | FileTokenizer) -> str:
    """The tokenizer as a string for a run's spec: "byte", or its `tokenizers` JSON."""
    return "byte" if isinstance(tokenizer, ByteTokenizer) else tokenizer.to_json()


def tokenizer_from_spec(text: str) -> ByteTokenizer | FileTokenizer:
    """The tokenizer `tokenizer_spec` wrote."""
    return ByteTokenizer() if text == "byte" else FileTokenizer(Tokenizer.from_str(text))
