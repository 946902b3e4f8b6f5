"""Every repository path and relative link that the README and the docs cite exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "CHANGELOG.md", "benchmarks/README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                                     for p in (ROOT / "docs").glob("*.md"))]
TOP = r"(?:lavo_tasks|kernels|tasks|configs|notebooks|tests|docs|benchmarks|\.ci)"
# A path starts at a word boundary (not inside another path, a URL or $VAR/...) and ends on a
# word character or a slash, so prose punctuation after it is not part of it.
REPO_PATH = re.compile(rf"(?<![\w/.$~-])({TOP}/[\w./-]*[\w/]|{TOP}/|README\.md|CHANGELOG\.md|setup\.py|pyproject\.toml)")
PLACEHOLDER = re.compile(r"[<*{]")  # configs/task/<name>.yaml, tests/tasks/*: patterns, not paths
LINK = re.compile(r"\]\(([^)\s]+)\)")
# The README's example of a task of one's own: its files live in the user's folder
# (LAVO_TASKS_PATH), not in this repository.
USER_FOLDER_EXAMPLES = {"README.md": {"tasks/count/__init__.py", "configs/task/count.yaml"}}


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)}


def cited_paths(text: str) -> set[str]:
    paths = set()
    for match in REPO_PATH.finditer(text):
        if not PLACEHOLDER.match(text, match.end()):
            paths.add(match.group(1))
    return paths


def test_the_path_finder_reads_prose_as_intended():
    text = ("See tests/core/test_sweep.py, `kernels/lavo/chunk.py` `LAUNCH` and configs/task/<name>.yaml; "
            "cd /tmp && pytest $REPO/tests/kernels; https://x.org/docs/a.md; docs/.")
    assert cited_paths(text) == {"tests/core/test_sweep.py", "kernels/lavo/chunk.py", "docs/"}
    assert slug("End to end: one step of each task (`bench_e2e`)") == "end-to-end-one-step-of-each-task-bench_e2e"


def test_every_cited_path_and_link_exists():
    missing = []
    for doc in DOCS:
        page = ROOT / doc
        text = page.read_text()
        cited = cited_paths(text)
        examples = USER_FOLDER_EXAMPLES.get(doc, set())
        assert examples <= cited, f"{doc} no longer cites {examples - cited}: drop them from USER_FOLDER_EXAMPLES"
        missing += [f"{doc}: {p}" for p in sorted(cited - examples) if not (ROOT / p).exists()]
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                missing.append(f"{doc}: link {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                missing.append(f"{doc}: link {target} (no such heading)")
    assert not missing, "cited but absent:\n" + "\n".join(missing)


def test_sections_of_benchmarks_md_cited_in_the_code_exist():
    """A comment or docstring that cites a section of benchmarks.md (the path, a comma and the
    quoted start of a heading) names a heading that exists."""
    headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / "benchmarks.md").read_text(), flags=re.M)
    cited = []
    for folder in ("lavo_tasks", "kernels", "tasks", "configs", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".yaml", ".sh"):
                continue
            text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())  # comment lines joined
            cited += [(path.relative_to(ROOT), name) for name in re.findall(r'docs/benchmarks\.md, "([^"]+)"', text)]
    assert cited, "no citation found: the pattern no longer matches the code's style"
    missing = [f"{path}: {name}" for path, name in cited if not any(h.startswith(name) for h in headings)]
    assert not missing, "cited sections absent from docs/benchmarks.md:\n" + "\n".join(missing)
