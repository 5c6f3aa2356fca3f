"""Where the repository is: the tools start the workspace's binaries and read its data by
paths relative to its root, as the Rust binaries' defaults are."""

from __future__ import annotations

import functools
from pathlib import Path


def _is_root(folder: Path) -> bool:
    return (folder / "Cargo.toml").is_file() and (folder / "tools" / "pyproject.toml").is_file()


@functools.cache
def repo_root() -> Path:
    """The checkout this package is installed from (scripts/setup.sh installs it editable),
    else the nearest checkout above the working directory."""
    here = Path(__file__).resolve().parents[2]
    if _is_root(here):
        return here
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if _is_root(folder):
            return folder
    raise RuntimeError("nmt_tools: no checkout of the repository here or above the working directory")


def shown(path: str | Path) -> str:
    """A path as reports show it: relative to the repository root when inside it."""
    absolute = Path(path).resolve()
    try:
        return str(absolute.relative_to(repo_root()))
    except ValueError:
        return str(path)
