"""The default-data cache: where it is, built once per recipe, never half a build."""

import json
from pathlib import Path

import pytest

from lavo_tasks.default_data import CACHE_ENV, RECIPE_FILE, cache_root, default_data, recipe_key
from lavo_tasks.errors import ConfigError

RECIPE = {"builder": "test", "version": 1, "rows": 3}


def counting_build(calls: list):
    """A build that writes one file and records the folder it was given."""
    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "rows.txt").write_text("a\nb\nc\n")
    return build


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "lavo-tasks"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "lavo-tasks"


def test_the_tests_never_write_into_the_home_cache():
    assert cache_root() != Path.home() / ".cache" / "lavo-tasks"


def test_a_second_call_reuses_the_first_build(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    calls = []
    first = default_data("demo", RECIPE, counting_build(calls))
    second = default_data("demo", dict(reversed(RECIPE.items())), counting_build(calls))  # same recipe, other order
    assert first == second == tmp_path / "demo" / recipe_key(RECIPE)
    assert len(calls) == 1 and calls[0] != first  # built elsewhere, then renamed into place
    assert (first / "rows.txt").read_text() == "a\nb\nc\n"
    assert json.loads((first / RECIPE_FILE).read_text()) == RECIPE
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [first.name]  # no temporary folder left


def test_another_recipe_builds_another_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    calls = []
    a = default_data("demo", RECIPE, counting_build(calls))
    b = default_data("demo", {**RECIPE, "version": 2}, counting_build(calls))
    assert a != b and len(calls) == 2 and a.is_dir() and b.is_dir()


def test_an_interrupted_build_leaves_nothing_a_later_run_trusts(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))

    def half_build(folder: Path) -> None:
        (folder / "rows.txt").write_text("a\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        default_data("demo", RECIPE, half_build)
    assert list((tmp_path / "demo").iterdir()) == []
    calls = []
    folder = default_data("demo", RECIPE, counting_build(calls))
    assert len(calls) == 1 and (folder / "rows.txt").read_text() == "a\nb\nc\n"


def test_a_build_that_another_process_finished_first_is_dropped(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    final = tmp_path / "demo" / recipe_key(RECIPE)

    def racing_build(folder: Path) -> None:
        (folder / "rows.txt").write_text("ours\n")
        final.mkdir()  # the other process renames its whole build into place meanwhile
        (final / "rows.txt").write_text("theirs\n")

    assert default_data("demo", RECIPE, racing_build) == final
    assert (final / "rows.txt").read_text() == "theirs\n"
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [final.name]


def test_an_unwritable_cache_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "file" / "cache"))
    with pytest.raises(ConfigError, match=rf"^{CACHE_ENV}: cannot write the default-data cache at .*file/cache/demo"):
        default_data("demo", RECIPE, counting_build([]))
