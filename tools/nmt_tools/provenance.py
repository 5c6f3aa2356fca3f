"""What a report records about how it was made: the commit, the versions of the libraries
measured, when, and the command that reproduces it."""

from __future__ import annotations

import datetime
import importlib.metadata
import shlex
import subprocess
import sys

from nmt_tools.paths import repo_root


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=repo_root(), check=False)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def git_state() -> dict[str, str | bool]:
    """The checkout's commit and whether its working tree has uncommitted changes."""
    return {"commit": _git("rev-parse", "HEAD") or "unknown", "dirty": bool(_git("status", "--porcelain"))}


def short_commit() -> str:
    return _git("rev-parse", "--short", "HEAD") or "unknown"


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def version(distribution: str) -> str:
    """An installed distribution's version, read from its metadata (nothing is imported)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command that reran this module with these arguments, as a report shows it."""
    return shlex.join(["python3", "-m", module, *(sys.argv[1:] if argv is None else argv)])
