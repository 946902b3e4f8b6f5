"""The embedded default text: English prose every Python installation carries.

The documents are the docstrings of the standard library's own modules (module, class
and function docstrings, read with `ast`, so nothing is imported or executed). Nothing
is stored in the repository: the corpus is gathered at run time (about 3 s, under 2 MB)
in a fixed order, and each module goes to train, validation or test by a hash of its
path, so the split is the same on every run and does not shift when a module is added.
The splits are named `train`, `val`, `test`, as in every task's code.
"""

import ast
import contextlib
import functools
import gc
import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "val", "test")

# Folders of the standard library that hold tests, test data or third-party code.
_SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages"}
_MIN_WORDS = 5  # docstrings shorter than this are mostly "Return x." noise
_PERCENT_VALIDATION, _PERCENT_TEST = 5, 5


@dataclass(frozen=True)
class ModuleDocs:
    """One standard-library module: its path relative to the stdlib root (e.g.
    `json/decoder.py`) and its docstrings in source order, module docstring first."""

    name: str
    docstrings: tuple[str, ...]

    @property
    def text(self) -> str:
        """The module as one document: its docstrings separated by blank lines."""
        return "\n\n".join(self.docstrings)


def _docstrings(source: bytes) -> list[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):  # breadth-first from the module: a fixed order
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc.split()) >= _MIN_WORDS:
                found.append(doc)
    return found


def _stdlib_files(root: Path) -> list[Path]:
    """The .py files under root outside _SKIPPED_DIRS; those folders are not walked at all
    (site-packages alone holds several times the standard library's files)."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in _SKIPPED_DIRS]
        files += [Path(folder) / name for name in names if name.endswith(".py")]
    return files


@contextlib.contextmanager
def _no_cyclic_gc():
    """Hold the cyclic garbage collector while the syntax trees are built. A tree has no
    reference cycles and is freed as soon as its file is read; but its millions of
    allocations trigger full collections that walk the whole heap, which in a process that
    has imported torch and Lightning (a test worker, a training run) cost about as much as
    the parsing itself, and more the larger the heap."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@functools.cache
def stdlib_modules() -> tuple[ModuleDocs, ...]:
    """Every standard-library module with at least one docstring, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = []
    with _no_cyclic_gc():
        for path in sorted(_stdlib_files(root)):
            relative = path.relative_to(root)
            try:
                docs = _docstrings(path.read_bytes())
            except (SyntaxError, ValueError):  # a few files are templates or Python 2 samples
                continue
            if docs:
                modules.append(ModuleDocs(relative.as_posix(), tuple(docs)))
    if not modules:
        raise RuntimeError(f"no docstrings found under the standard library at {root}")
    return tuple(modules)


def split_of(name: str) -> str:
    """train / val / test for a module path: a fixed hash, about 90 / 5 / 5 %."""
    bucket = zlib.crc32(name.encode()) % 100
    if bucket < _PERCENT_VALIDATION:
        return "val"
    if bucket < _PERCENT_VALIDATION + _PERCENT_TEST:
        return "test"
    return "train"


def stdlib_splits() -> dict[str, list[ModuleDocs]]:
    """The standard-library modules grouped by split, each list sorted by path."""
    splits: dict[str, list[ModuleDocs]] = {name: [] for name in SPLITS}
    for module in stdlib_modules():
        splits[split_of(module.name)].append(module)
    return splits
