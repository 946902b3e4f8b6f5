"""Packaging: kernels/, tasks/ and configs/ install inside lavo_tasks, found without a
hand-kept list (setup.py's discovery), in a regular install (the wheel) and an editable
one (this checkout's venv)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder of the checkout -> the package it installs as (docs/design.md §1)
MAPPED = {"lavo_tasks": "lavo_tasks", "kernels": "lavo_tasks.kernels", "tasks": "lavo_tasks.tasks",
          "configs": "lavo_tasks.configs"}


def package_files() -> set[str]:
    """As installed paths: every .py file of a package (a folder with an __init__.py under
    a mapped folder) and every YAML file under configs/ (package data)."""
    files = set()
    for folder, package in MAPPED.items():
        for path in (ROOT / folder).rglob("*"):
            in_package = all((parent / "__init__.py").is_file() for parent in [path.parent, *path.parent.parents]
                             if parent.is_relative_to(ROOT / folder))
            if (path.suffix == ".py" and in_package) or (path.suffix == ".yaml" and folder == "configs"):
                files.add("/".join([*package.split("."), *path.relative_to(ROOT / folder).parts]))
    return files


@pytest.mark.slow
def test_the_wheel_holds_every_package_file(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("lavo_tasks-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = package_files()
    assert {"lavo_tasks/tasks/lm/__init__.py", "lavo_tasks/kernels/lavo/__init__.py",
            "lavo_tasks/configs/task/tsf.yaml", "lavo_tasks/task.py"} <= expected
    assert expected <= names, sorted(expected - names)
    assert not [name for name in names if name.split("/")[0] in ("kernels", "tasks", "configs")]


def test_the_editable_install_imports_the_mapped_packages(tmp_path):
    code = ("import lavo_tasks.kernels.lavo, lavo_tasks.tasks.lm, lavo_tasks.tasks.tsf; "
            "from importlib import resources; "
            "print(lavo_tasks.kernels.lavo.__file__, lavo_tasks.tasks.lm.__file__, "
            "(resources.files('lavo_tasks.configs') / 'task' / 'lm.yaml').is_file())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    kernels, lm, config_found = result.stdout.split()
    assert Path(kernels) == ROOT / "kernels" / "lavo" / "__init__.py"
    assert Path(lm) == ROOT / "tasks" / "lm" / "__init__.py"
    assert config_found == "True"
