"""The embedded default: English sentences spoken by espeak-ng, in the LJSpeech layout.

The `espeakng-loader` wheel carries `libespeak-ng.so` and its voice data, so nothing
needs a system package. The library is called through ctypes in its synchronous mode
(`espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS)`): `espeak_Synth` returns once the whole
utterance has passed through the sample callback, 16-bit mono at the library's rate
(22,050 Hz). The same library, given the same text and voice, makes the same samples, so
the default dataset is the same bytes on every build.

The sentences are short ones from the standard library's docstrings
(`lavo_tasks.text.corpus`), kept only when they are plain prose (a capital letter, words,
commas, a final full stop), ordered by a CRC of their text and cut at
`DEFAULT_UTTERANCES`.
"""

import ctypes
import functools
import platform
import re
import shutil
import tempfile
import zlib
from importlib.metadata import version
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm

from ...text.corpus import stdlib_modules
from ...errors import ConfigError
from ...files import write_atomically

DEFAULT_UTTERANCES = 400
BUILDER_VERSION = 1  # raise it when what write_default_dataset writes from the same sentences changes
DEFAULT_VOICE = "en-us"
SAMPLE_RATE = 22_050
WORDS = (4, 10)  # a sentence's word count, inclusive bounds: one to three seconds of speech
_PLAIN_SENTENCE = re.compile(r"[A-Z][a-z ,']*[a-z]\.")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
# int callback(short *wav, int numsamples, espeak_EVENT *events); 0 = go on
_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def espeak_paths() -> tuple[str, str]:
    """(libespeak-ng.so, its espeak-ng-data folder) from the espeakng-loader wheel;
    ConfigError when the wheel is missing."""
    try:
        import espeakng_loader
    except ImportError:
        raise ConfigError(
            "the tts default data and data.frontend=phonemes need espeak-ng: pip install espeakng-loader"
        ) from None
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def _private_copy(library: str) -> ctypes.CDLL:
    """The library loaded from a copy of its file, so with static variables of its own.

    espeak-ng's wave generator keeps state in static variables that neither
    espeak_Terminate nor espeak_Initialize resets (the pitch flutter's position, for
    one), so an utterance's samples depend on every utterance spoken before it in the
    process. A fresh copy starts from the same state every time; the file can go once
    it is mapped.
    """
    with tempfile.TemporaryDirectory(prefix="espeak-ng-") as folder:
        copy = shutil.copy(library, folder)
        return ctypes.CDLL(copy)


class Speaker:
    """espeak-ng in synchronous mode: `speak(text)` -> int16 samples at `sample_rate`.

    Each Speaker has its own instance of the library (`_private_copy`): the same texts
    spoken in the same order by a new Speaker give the same samples.
    """

    def __init__(self, voice: str = DEFAULT_VOICE):
        library, data = espeak_paths()
        self._lib = _private_copy(library)
        self._lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                           ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self.sample_rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data.encode(), 0)
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({self.sample_rate}) with the data at {data}")
        self._chunks: list[np.ndarray] = []
        self._callback = _SynthCallback(self._collect)  # kept alive: the library holds its pointer
        self._lib.espeak_SetSynthCallback(self._callback)
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ConfigError(f"espeak-ng has no voice {voice!r}")

    def _collect(self, wav, n_samples: int, events) -> int:
        if n_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n_samples,)).copy())
        return 0

    def speak(self, text: str) -> np.ndarray:
        """int16 [samples] of `text` spoken."""
        self._chunks = []
        encoded = text.encode()
        status = self._lib.espeak_Synth(encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        self._lib.espeak_Synchronize()
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed ({status}) on {text!r}")
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)


@functools.cache
def default_sentences(count: int = DEFAULT_UTTERANCES) -> tuple[str, ...]:
    """`count` distinct plain sentences of WORDS words from the standard library's
    docstrings, in a fixed order (by CRC-32 of the text, then the text)."""
    found = set()
    for module in stdlib_modules():
        for doc in module.docstrings:
            for paragraph in re.split(r"\n\s*\n", doc):
                for sentence in _SENTENCE_END.split(" ".join(paragraph.split())):
                    if WORDS[0] <= len(sentence.split()) <= WORDS[1] and _PLAIN_SENTENCE.fullmatch(sentence):
                        found.add(sentence)
    ordered = sorted(found, key=lambda s: (zlib.crc32(s.encode()), s))
    if len(ordered) < count:
        raise RuntimeError(f"only {len(ordered)} plain sentences in the standard library's docstrings, not {count}")
    return tuple(ordered[:count])


def utterance_id(index: int) -> str:
    return f"espeak-{index + 1:04d}"


def recipe() -> dict:
    """What the default dataset depends on: this builder's version and sizes, the Python
    whose docstrings give the sentences, and the espeak-ng that speaks them."""
    return {"builder": "tts.speech", "version": BUILDER_VERSION, "utterances": DEFAULT_UTTERANCES,
            "voice": DEFAULT_VOICE, "sample_rate": SAMPLE_RATE, "words": list(WORDS),
            "python": platform.python_version(), "espeakng-loader": version("espeakng-loader")}


def write_default_dataset(root: Path, count: int = DEFAULT_UTTERANCES) -> None:
    """Write `root/metadata.csv` and `root/wavs/<id>.wav` (16-bit PCM mono, 22,050 Hz).

    metadata.csv is written last: a folder with it is complete, and a build stopped
    half-way is redone from the start by the next one (each wav is written atomically).
    """
    sentences = default_sentences(count)
    speaker = Speaker()
    if speaker.sample_rate != SAMPLE_RATE:
        raise RuntimeError(f"espeak-ng speaks at {speaker.sample_rate} Hz, not {SAMPLE_RATE}")
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, sentence in enumerate(tqdm(sentences, desc="espeak-ng default data", unit="utt")):
        samples = speaker.speak(sentence)
        write_atomically(root / "wavs" / f"{utterance_id(i)}.wav",
                         lambda f: sf.write(f, samples, SAMPLE_RATE, subtype="PCM_16", format="WAV"))
        lines.append(f"{utterance_id(i)}|{sentence}|{sentence}\n")
    write_atomically(root / "metadata.csv", lambda f: f.write("".join(lines).encode()))
