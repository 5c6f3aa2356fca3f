"""Shared by the smoke tests: where the package and the repository are."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "nmt_tools"
REPO = TESTS.parent.parent
