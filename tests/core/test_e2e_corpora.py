"""benchmarks/e2e_corpora.py: the long-source summarization examples it makes of a module."""

import importlib.util
import json
from pathlib import Path

from lavo_tasks.tasks.summarization.formats import read_jsonl

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e_corpora.py"
spec = importlib.util.spec_from_file_location("e2e_corpora", SCRIPT)
corpora = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpora)

FILLER = "\n".join(f"value_{i} = {i}  # a line of filler" for i in range(1200))  # about 40,000 characters
MODULE = f'''"""Tools for tests.

A second paragraph the summary leaves out.
"""
import os


class Box:
    """Holds one thing.

    More about boxes.
    """

    def open(self):
        """Open the box."""

    def _quiet(self):
        return 1


def helper():
    return 2


async def fetch():
    """Fetch later."""

{FILLER}
'''


def test_a_long_module_becomes_its_source_and_its_outline(tmp_path):
    example = corpora.module_example(MODULE)
    assert example["summary"] == "Tools for tests.\nBox: Holds one thing.\nBox.open: Open the box.\nfetch: Fetch later."
    assert example["document"].startswith("import os\n\n\nclass Box:")
    assert "A second paragraph" not in example["document"]
    assert example["document"].endswith("value_1199 = 1199  # a line of filler")
    # the summarization task reads what the corpus writes
    file = tmp_path / "train.jsonl"
    file.write_text(json.dumps(example) + "\n")
    assert list(read_jsonl(file, "summary", "target")) == [example["summary"]]
    assert list(read_jsonl(file, "document", "source")) == [example["document"]]


def test_short_modules_and_modules_without_a_docstring_are_left_out():
    assert corpora.module_example(MODULE[:20_000]) is None
    assert corpora.module_example(MODULE.split('"""\nimport os', 1)[1]) is None  # no docstring
    assert corpora.module_example('"""Doc."""\n' + "x = (\n" * 5000) is None  # not Python
    # long only with its docstring: 22,400 characters of source after a 2,006-character docstring
    docstring = '"""' + "d" * 2_000 + '"""\n'
    assert corpora.module_example(docstring + "x = 1  # filler\n" * 1_400) is None
    assert corpora.module_example(docstring + "x = 1  # filler\n" * 1_600) is not None
