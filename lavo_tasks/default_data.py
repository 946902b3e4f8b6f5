"""The embedded default datasets, built once per machine into a cache that runs share.

A task whose `data.path` is empty trains on data it makes itself (espeak-ng speech,
open3d shapes, a gluonts series, standard-library documents). That data depends only on
what built it, never on the run, so it lives outside the run folders:

    <cache root>/<task>/<key>/          the finished dataset, in the task's real layout
    <cache root>/<task>/<key>/RECIPE.json   what built it (the recipe the key hashes)

The cache root is `$LAVO_TASKS_CACHE` when set, else `$XDG_CACHE_HOME/lavo-tasks`, else
`~/.cache/lavo-tasks`. The key is a hash of the recipe: the builder's name and version,
its parameters, and the versions of the libraries whose output it stores. A change to
any of them builds a new folder beside the old one.

A dataset is built into a temporary folder beside its final place and renamed there when
complete; the rename is atomic, so a folder under its key is always whole. A build that
is interrupted leaves only its temporary folder, which no run reads; two runs that build
at once both finish, the first rename wins and the second build is thrown away.
"""

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import ConfigError
from .files import current_umask

CACHE_ENV = "LAVO_TASKS_CACHE"
RECIPE_FILE = "RECIPE.json"
KEY_LENGTH = 16  # hex digits of the recipe's SHA-256


def cache_root() -> Path:
    """The folder every task's default data goes under (module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser().absolute() / "lavo-tasks"


def recipe_key(recipe: Mapping) -> str:
    """The folder name of a recipe: a hash of its canonical JSON (sorted keys), so the
    same recipe written in another order has the same key."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_LENGTH]


def default_data(task: str, recipe: Mapping, build: Callable[[Path], None]) -> Path:
    """The folder of `task`'s default data made by `recipe`, calling `build(folder)` to
    fill an empty folder first when this machine has none yet.

    `recipe` must be JSON-serialisable and name everything the built files depend on.
    ConfigError (naming LAVO_TASKS_CACHE) when the cache root cannot be written."""
    folder = cache_root() / task / recipe_key(recipe)
    if folder.is_dir():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".building", dir=folder.parent))
    except OSError as err:
        raise ConfigError(f"{CACHE_ENV}: cannot write the default-data cache at {folder.parent} "
                          f"({err.strerror}); set {CACHE_ENV} to a writable folder") from None
    try:
        os.chmod(building, 0o777 & ~current_umask())  # mkdtemp's 0o700 would hide the data from a shared cache
        build(building)
        (building / RECIPE_FILE).write_text(json.dumps(recipe, sort_keys=True, indent=1) + "\n", encoding="utf-8")
        try:
            building.rename(folder)
        except OSError:
            if not folder.is_dir():  # not another build that finished first: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder
