"""Text to symbol ids: normalisation, then characters or espeak-ng phonemes.

Normalisation: Unicode NFKD with the combining marks dropped ("café" -> "cafe"),
lower case, runs of white space as one space. LJSpeech's third column already spells
out numbers and abbreviations; other text is taken as written.

The vocabulary is the symbols of the training transcripts, sorted, after three
reserved ids: padding, end of text (appended to every transcript) and unknown (a
symbol the training split never had).
"""

import unicodedata
from collections.abc import Iterable, Sequence

from ...errors import ConfigError
from .speech import DEFAULT_VOICE, espeak_paths

FRONTENDS = ("characters", "phonemes")
PAD, EOS, UNK = 0, 1, 2
RESERVED = ("<pad>", "</s>", "<unk>")


def normalize(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(plain.lower().split())


def phonemize(texts: Sequence[str]) -> list[str]:
    """IPA strings (with stress marks and punctuation) of normalised texts, spoken as
    espeak-ng's en-us voice would; ConfigError when phonemizer or the library is missing."""
    library, data = espeak_paths()
    try:
        from phonemizer.backend import EspeakBackend
        from phonemizer.backend.espeak.wrapper import EspeakWrapper
    except ImportError:
        raise ConfigError("data.frontend=phonemes needs phonemizer: pip install phonemizer") from None
    EspeakWrapper.set_library(library)
    EspeakWrapper.set_data_path(data)
    backend = EspeakBackend(DEFAULT_VOICE, preserve_punctuation=True, with_stress=True)
    return [" ".join(p.split()) for p in backend.phonemize(list(texts), strip=True)]


def to_symbols(texts: Sequence[str], frontend: str) -> list[str]:
    """Each normalised text as its string of symbols (one character each)."""
    if frontend not in FRONTENDS:
        raise ConfigError(f"data.frontend={frontend!r}: allowed {', '.join(FRONTENDS)}")
    return phonemize(texts) if frontend == "phonemes" else list(texts)


def build_vocabulary(symbol_strings: Iterable[str]) -> list[str]:
    """RESERVED + the sorted distinct symbols."""
    return [*RESERVED, *sorted(set().union(*map(set, symbol_strings)))]


def encode(symbols: str, vocabulary: Sequence[str]) -> list[int]:
    """Ids of `symbols` followed by EOS; a symbol outside the vocabulary is UNK."""
    index = {s: i for i, s in enumerate(vocabulary)}
    return [index.get(s, UNK) for s in symbols] + [EOS]
