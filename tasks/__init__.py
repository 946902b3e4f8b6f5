"""The tasks, found by name: each is a subpackage `lavo_tasks.tasks.<name>` exporting
`TASK` (a `lavo_tasks.task.Task`, which states the contract) with its YAML file
`configs/task/<name>.yaml`. Adding a task touches no other file.

Tasks outside the installed package: `LAVO_TASKS_PATH` lists folders (separated by
`os.pathsep`), each laid out like this repository, `tasks/<name>/__init__.py` and
`configs/task/<name>.yaml`. Their `tasks/` folders join this package's search path
(as `pkgutil.extend_path` would), so such a task imports as `lavo_tasks.tasks.<name>`
and its relative imports work as in an installed one.
"""

import importlib
import os
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from ..task import Task

PATH_ENV = "LAVO_TASKS_PATH"


def _extra_roots() -> list[Path]:
    return [Path(p).expanduser().absolute() for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p]


def _yaml_files():
    """{name: the task's YAML file}: the package's own, then LAVO_TASKS_PATH's in order
    (the first of a name wins)."""
    files = {}
    folders = [resources.files("lavo_tasks.configs") / "task", *(root / "configs" / "task" for root in _extra_roots())]
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            if entry.name.endswith(".yaml"):
                files.setdefault(entry.name.removesuffix(".yaml"), entry)
    return files


def task_names() -> list[str]:
    return sorted(_yaml_files())


def task_yaml_text(name: str) -> str:
    files = _yaml_files()
    if name not in files:
        raise ConfigError(f"task={name!r}: unknown task; allowed: {', '.join(sorted(files))}")
    return files[name].read_text(encoding="utf-8")


def load_task(name: str) -> Task:
    """The TASK of `lavo_tasks.tasks.<name>`; ConfigError for an unknown name or a package
    that does not keep the contract."""
    if name not in task_names():
        raise ConfigError(f"task={name!r}: unknown task; allowed: {', '.join(task_names())}")
    for root in _extra_roots():
        folder = root / "tasks"
        if folder.is_dir() and str(folder) not in __path__:
            __path__.append(str(folder))
    package = f"{__name__}.{name}"
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as err:
        if err.name != package:
            raise
        raise ConfigError(f"task={name!r}: configs/task/{name}.yaml exists but no package {package} "
                          f"(a folder tasks/{name}/ with an __init__.py)") from None
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task) or task.name != name:
        raise ConfigError(f"task={name!r}: {package} must export TASK = lavo_tasks.task.Task(name={name!r}, ...)")
    return task
