"""The benchmark inputs as nmt-bench reads them (bench/src/verses.rs): a `.tsv` file by its
`en` column, anything else every non-empty line, trimmed. The Rust workers report how many
texts they read; nmt_tools.ct2.compare checks that every side read as many."""

from __future__ import annotations

from pathlib import Path


def _lines(text: str) -> list[str]:
    """Rust's `str::lines`: split at `\n`, a `\r` before it dropped, no empty last line."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and not lines[-1] else lines


def parse_lines(text: str) -> list[str]:
    """Every non-empty line, trimmed."""
    return [line.strip() for line in _lines(text) if line.strip()]


def parse_tsv(text: str) -> list[str]:
    """The non-empty cells of the `en` column of a tab-separated table with a header line."""
    lines = _lines(text)
    if not lines:
        raise ValueError("empty file")
    header = lines[0].split("\t")
    columns = [c.strip() for c in header]
    if "en" not in columns:
        raise ValueError(f"no `en` column in the header {header}")
    col = columns.index("en")
    out = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise ValueError(f"line {number}: {len(cells)} columns, the header has {len(header)}")
        if cells[col].strip():
            out.append(cells[col].strip())
    return out


def load(path: str | Path) -> list[str]:
    """The English texts of `path`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    verses = parse_tsv(text) if path.suffix.lower() == ".tsv" else parse_lines(text)
    if not verses:
        raise ValueError(f"{path}: no texts")
    return verses
