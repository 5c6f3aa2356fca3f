"""Rules of the package that ruff and mypy do not check."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from conftest import PACKAGE, REPO

# The scripts the Rust binaries carry (include_str!) and run with `python3 -c`.
EMBEDDED = [
    REPO / "eval" / "src" / "sacrebleu_cli.py",
    REPO / "model-export" / "python" / "quantize.py",
    REPO / "model-export" / "python" / "marian_tokenizers.py",
    REPO / "model-export" / "python" / "length_head.py",
]
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + EMBEDDED


def test_functions_are_short() -> None:
    long = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long


def test_no_import_path_edits() -> None:
    """Modules import each other as a package (`pip install -e tools`), never by path."""
    for path in sources():
        assert "sys.path" not in path.read_text(encoding="utf-8"), path


def test_the_only_python_outside_the_package_is_embedded() -> None:
    """Python lives in tools/, except the scripts the Rust binaries carry."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--deduplicate", "*.py"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.split()
    outside = {REPO / p for p in listed if not p.startswith("tools/") and (REPO / p).exists()}
    assert outside == set(EMBEDDED)
