"""The espeak-ng default: the same bytes on every build, in the LJSpeech layout, audible."""

import hashlib

import numpy as np
import soundfile as sf

from lavo_tasks.tasks.tts.data import read_metadata
from lavo_tasks.tasks.tts.speech import SAMPLE_RATE, Speaker, default_sentences, write_default_dataset


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_default_builds_the_same_bytes_twice(tmp_path):
    write_default_dataset(tmp_path / "a", count=4)
    write_default_dataset(tmp_path / "b", count=4)
    first = digest(tmp_path / "a")
    assert len(first) == 5 and first == digest(tmp_path / "b")
    utterances = read_metadata(tmp_path / "a")  # the same reader as any LJSpeech folder
    assert [u.text for u in utterances] == [s.lower() for s in default_sentences(4)]
    for u in utterances:
        info = sf.info(u.wav)
        assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")
        assert 0.5 < info.duration < 6


def test_sentences_are_plain_and_distinct():
    sentences = default_sentences()
    assert len(sentences) == len(set(sentences)) == 400
    assert all(s[0].isupper() and s.endswith(".") and 4 <= len(s.split()) <= 10 for s in sentences)


def test_speech_is_voiced_where_the_words_are():
    speaker = Speaker()
    short, long = speaker.speak("Yes."), speaker.speak("Return the number of items in a container.")
    assert 0.2 * SAMPLE_RATE < len(short) < len(long)
    frames = long[: len(long) // 256 * 256].astype(np.float64).reshape(-1, 256)
    loud = np.sqrt((frames ** 2).mean(1)) > 300
    assert 0.4 < loud.mean() < 0.98  # speech with pauses, neither silence nor a constant tone
