"""Corpora for `e2e_steps.sh` written from the Python standard library's own sources, so
that a GPU machine with no data and no internet can measure lm and summarization at the
lengths of their cab presets.

    python benchmarks/e2e_corpora.py lm OUT_FOLDER           # train/valid/test.txt
    python benchmarks/e2e_corpora.py summarization OUT_FOLDER  # train/val/test.jsonl

lm: every source file as text, about 10 MB of train (the BPE trains on it in seconds),
every 20th file to valid and to test. Enough for the cab context (8,192 tokens a sample,
8 samples in the test split).

summarization: one example per module with a module docstring whose source without
that docstring (the document) holds at least 24,000 characters; the summary is its
outline (`module_outline`). At about 4 characters a BPE token (vocabulary 32,000) every
document fills the cab preset's 4,096 source positions, as Multi-News's do. The outlines
are shorter than its 400 target positions (Python 3.11's library: a median of about
1,050 characters), so each batch's targets are padded to its longest.
"""

import ast
import json
import sys
import sysconfig
from pathlib import Path

LM_TRAIN_CHARS = 10_000_000
LONG_MODULE_CHARS = 24_000


def stdlib_sources() -> list[tuple[Path, str]]:
    """The standard library's .py files (site-packages excluded), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return [(p, p.read_text(encoding="utf-8", errors="replace")) for p in files]


def write_lm(out: Path) -> None:
    texts = [text for _, text in stdlib_sources()]
    splits = {"valid.txt": texts[0::20], "test.txt": texts[1::20]}
    train, size = [], 0
    for text in (t for i, t in enumerate(texts) if i % 20 > 1):
        if size > LM_TRAIN_CHARS:
            break
        train.append(text)
        size += len(text)
    splits["train.txt"] = train
    for name, docs in splits.items():
        (out / name).write_text("\n\n".join(docs), encoding="utf-8")
        print(f"{out / name}: {sum(map(len, docs)) / 1e6:.1f} MB")


DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def module_outline(tree: ast.Module, doc: str) -> str:
    """A module's summary: its docstring's first paragraph, then one line per top-level
    class or function and per method that has a docstring: its name and the docstring's
    first line."""
    lines = [doc.split("\n\n")[0].strip()]
    for node in tree.body:
        if not isinstance(node, DEFINITIONS):
            continue
        members = [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, DEFINITIONS)] \
            if isinstance(node, ast.ClassDef) else []
        for name, definition in [(node.name, node), *members]:
            first = (ast.get_docstring(definition) or "").strip().split("\n")[0]
            if first:
                lines.append(f"{name}: {first}")
    return "\n".join(lines)


def module_example(text: str) -> dict | None:
    """{"document", "summary"} of a module with a docstring and a long document, else
    None: the source without its docstring, and its outline."""
    if len(text) < LONG_MODULE_CHARS:  # (the document is shorter still)
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):  # test data in the standard library that is not Python
        return None
    doc = ast.get_docstring(tree)
    if not doc:
        return None
    first = tree.body[0]  # the docstring's statement
    lines = text.splitlines()
    document = "\n".join(lines[:first.lineno - 1] + lines[first.end_lineno:]).strip()
    if len(document) < LONG_MODULE_CHARS:
        return None
    return {"document": document, "summary": module_outline(tree, doc)}


def write_summarization(out: Path) -> None:
    examples = [e for _, text in stdlib_sources() if (e := module_example(text)) is not None]
    splits = {"val.jsonl": examples[0::20], "test.jsonl": examples[1::20],
              "train.jsonl": [e for i, e in enumerate(examples) if i % 20 > 1]}
    for name, rows in splits.items():
        with open(out / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        print(f"{out / name}: {len(rows)} examples")


WRITERS = {"lm": write_lm, "summarization": write_summarization}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in WRITERS:
        sys.exit(f"usage: python {sys.argv[0]} {{{'|'.join(WRITERS)}}} OUT_FOLDER")
    folder = Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    WRITERS[sys.argv[1]](folder)
