"""The studies' Markdown templates: their prose, the papers' numbers and the wording of each
finding live in Markdown files beside the study's record, and the code only fills in the
figures.

A template is a series of blocks, each opened by a line `<!-- block NAME -->` (an HTML
comment, so the file reads as Markdown); anything before the first block describes the file.
A block's `$placeholders` are filled by `string.Template`, so a missing value fails loudly
(`$$` is a literal `$`). Blocks named `paper-KEY` hold what a paper reports; every block can
cite one as `$paper_KEY`.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

BLOCK = re.compile(r"^<!-- block (\S+) -->$", re.MULTILINE)
PAPER = "paper-"


class Template:
    def __init__(self, text: str, source: str = "template") -> None:
        self.source = source
        parts = BLOCK.split(text)
        # parts: [preamble, name1, text1, name2, text2, ...]
        self.blocks = {name: body.strip("\n") for name, body in zip(parts[1::2], parts[2::2], strict=True)}
        self.papers = {
            f"paper_{name.removeprefix(PAPER)}": body for name, body in self.blocks.items() if name.startswith(PAPER)
        }

    @classmethod
    def load(cls, path: str | Path) -> Template:
        return cls(Path(path).read_text(encoding="utf-8"), str(path))

    def overridden_by(self, other: Template) -> Template:
        """This template with `other`'s blocks in place of its own of the same name: a page
        that differs from another in a few blocks keeps only those."""
        merged = Template("", f"{other.source} over {self.source}")
        merged.blocks = {**self.blocks, **other.blocks}
        merged.papers = {**self.papers, **other.papers}
        return merged

    def text(self, name: str, **values: object) -> str:
        """Block `name` with its placeholders filled."""
        if name not in self.blocks:
            raise KeyError(f"{self.source}: no block `{name}`")
        try:
            return string.Template(self.blocks[name]).substitute(self.papers, **values)
        except KeyError as missing:
            raise KeyError(f"{self.source}: block `{name}` needs a value for {missing}") from None

    def lines(self, name: str, **values: object) -> list[str]:
        """Block `name`, filled, as lines."""
        return self.text(name, **values).split("\n")
