"""The embedded default: multi-document examples made from the standard library's docstrings.

A document is one docstring of a module (lavo_tasks.text.corpus), its whitespace collapsed,
cut to its first sentences (at most DOCUMENT_CHARS characters, at least two sentences;
docstrings of one sentence, or whose first sentence is shorter than 3 or longer than 25
words, are not used). An example is 2-5 consecutive documents of one module (so they are
related: a module's classes and functions), joined by the Multi-News separator, and its
summary is **the first sentence of each document**, in order, joined by spaces. A model
has to find where each document starts; the lead baseline (the source's first words, as
many as the summary has) gets the first document's first sentence and then the rest of
that document, not the next ones.

Examples start at every document of a module, each with 2-5 documents (the number fixed
by a hash of module and position), dropping trailing documents while the source is
longer than SOURCE_CHARS; modules go to train / val / test as lavo_tasks.text.corpus splits
them (by a hash of the path), and a document already in an earlier split (train, then
val) is dropped from the later ones, so no document is in two splits. Sentences end at `.`,
`!` or `?` followed by a space and a capital letter.
"""

import platform
import re
import zlib
from pathlib import Path

from lavo_tasks.text.corpus import stdlib_splits

from .formats import SEPARATOR, SPLITS, write_multi_news

BUILDER_VERSION = 1  # raise it when the examples made from the same docstrings change

DOCUMENT_CHARS = 200
SOURCE_CHARS = 640
MIN_DOCUMENTS, MAX_DOCUMENTS = 2, 5
FIRST_SENTENCE_WORDS = (3, 25)
_SENTENCE_END = re.compile(r"(?<=[.!?]) (?=[A-Z])")


def sentences(text: str) -> list[str]:
    """The sentences of a text, its whitespace collapsed to single spaces."""
    return _SENTENCE_END.split(" ".join(text.split()))


def document_of(docstring: str) -> list[str] | None:
    """The sentences a docstring contributes as a document, or None if it is not used."""
    found = sentences(docstring)
    low, high = FIRST_SENTENCE_WORDS
    if len(found) < 2 or not low <= len(found[0].split()) <= high:
        return None
    kept = found[:2]
    for sentence in found[2:]:
        if len(" ".join([*kept, sentence])) > DOCUMENT_CHARS:
            break
        kept.append(sentence)
    return kept if len(" ".join(kept)) <= DOCUMENT_CHARS else None


def module_examples(name: str, documents: list[list[str]]) -> list[tuple[list[str], str]]:
    """(documents, summary) pairs of one module, from its documents' sentences."""
    examples = []
    for start in range(len(documents) - MIN_DOCUMENTS + 1):
        size = MIN_DOCUMENTS + zlib.crc32(f"{name}:{start}".encode()) % (MAX_DOCUMENTS - MIN_DOCUMENTS + 1)
        group = documents[start:start + size]
        while len(group) > MIN_DOCUMENTS and len(SEPARATOR.join(" ".join(d) for d in group)) > SOURCE_CHARS:
            group = group[:-1]
        if len(group) >= MIN_DOCUMENTS:
            examples.append(([" ".join(d) for d in group], " ".join(d[0] for d in group)))
    return examples


def default_examples() -> dict[str, list[tuple[list[str], str]]]:
    """The examples of each split (train, val, test), in a fixed order. A document that
    an earlier split has (some modules carry copies of another's docstrings) is dropped."""
    modules = stdlib_splits()
    seen: set[str] = set()
    examples = {}
    for split in SPLITS:
        found = []
        for module in modules[split]:
            documents = [d for d in map(document_of, module.docstrings) if d is not None and " ".join(d) not in seen]
            found += module_examples(module.name, documents)
        examples[split] = found
        seen.update(doc for docs, _ in found for doc in docs)
    return examples


def recipe() -> dict:
    """What the default examples depend on: this builder's version and sizes, and the
    Python whose standard library they come from."""
    return {"builder": "summarization.corpus", "version": BUILDER_VERSION, "document_chars": DOCUMENT_CHARS,
            "source_chars": SOURCE_CHARS, "documents": [MIN_DOCUMENTS, MAX_DOCUMENTS],
            "first_sentence_words": list(FIRST_SENTENCE_WORDS), "python": platform.python_version()}


def write_default_dataset(folder: Path) -> None:
    """The default examples as `{train,val,test}.src/.tgt` in `folder`."""
    for split, examples in default_examples().items():
        write_multi_news(folder, split, examples)
