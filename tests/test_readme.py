"""The README's Python example runs as written (it is the first thing users copy)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
        if "y" in namespace:  # the block example: cross-attention keeps the query shape
            assert tuple(namespace["y"].shape) == (2, 100, 256)
