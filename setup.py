"""Package discovery for pyproject.toml (everything else is declared there).

kernels/, tasks/ and configs/ stay top-level folders but install inside lavo_tasks
(`kernels` and `tasks` are taken on PyPI), a mapping that `[tool.setuptools.packages.find]`
cannot express: it names a package by its folder. So the packages are found here, under
each mapped folder, and a new task folder (tasks/<name>/ with an __init__.py) ships with
no edit to any packaging file.
"""

from setuptools import find_packages, setup

PACKAGE_DIRS = {
    "lavo_tasks": "lavo_tasks",
    "lavo_tasks.kernels": "kernels",
    "lavo_tasks.tasks": "tasks",
    "lavo_tasks.configs": "configs",
}


def mapped_packages() -> list[str]:
    """Every package under each folder of PACKAGE_DIRS, named inside its mapped package."""
    packages = list(PACKAGE_DIRS)
    for package, folder in PACKAGE_DIRS.items():
        packages += [f"{package}.{sub}" for sub in find_packages(folder)]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=mapped_packages(), package_dir=PACKAGE_DIRS)
