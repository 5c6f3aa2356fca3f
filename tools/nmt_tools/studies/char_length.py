"""Collates the nmt-eval reports of scripts/char-length-study.sh (lengths in characters) into
the section of docs/length-control.md between its `characters` markers.

    python3 -m nmt_tools.studies.char_length OUT SOURCES PACKAGE [--page docs/length-control.md]

OUT holds one nmt-eval report per run (`default`, `isometric`, `chars.reference`,
`subtitle.0.8`, `chars42`: the names the script gives them), SOURCES the English side of the
set they translated (its first lines, as many as were decoded), PACKAGE the package's path as
the page names it. Length compliance (LC) is the IWSLT 2022 isometric task's
(`isometric_slt_stat.py` of amazon-science/isometric-slt): characters without spaces within
±10% of the source's, or either side under 10 characters.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULE = "nmt_tools.studies.char_length"
BEGIN = "<!-- characters: begin (python3 -m nmt_tools.studies.char_length) -->"
END = "<!-- characters: end -->"
SENTENCE_ENDS = (".", "!", "?", "…")
RUNS = [
    ("default request (natural length: predicted, or the source's)", "default"),
    ('isometric, `target_chars` `"source"`', "isometric"),
    ("`target_chars` = the reference's characters", "chars.reference"),
    ("subtitle, `max_chars` = 0.8 × the reference's characters", "subtitle.0.8"),
    ("`max_chars` 42", "chars42"),
]
EXAMPLE_RUNS = [
    ("0.8 × reference, `max_chars`", "subtitle.0.8"),
    ("1.0 × reference, `target_chars`", "chars.reference"),
]
EXAMPLE_RUNS += [("isometric", "isometric")]


def isometric_compliant(source: str, output: str) -> bool:
    """IWSLT 2022's length compliance of one pair."""
    s, o = len(source.replace(" ", "")), len(output.replace(" ", ""))
    return s < 10 or o < 10 or abs(o - s) <= 0.1 * s


def sentence_end(text: str) -> str | None:
    """The sentence punctuation a text ends with, closing quotes and brackets passed over."""
    t = text.rstrip().rstrip("\"'»”’)]")
    return t[-1] if t and t[-1] in ".!?…:;" else None


def ending_counts(sources: list[str], texts: list[str]) -> tuple[int, int]:
    """Texts that end in . ! ?, and texts that end as their sources do."""
    ends = sum(sentence_end(t) in SENTENCE_ENDS for t in texts)
    as_source = sum(sentence_end(t) == sentence_end(s) for s, t in zip(sources, texts, strict=False))
    return ends, as_source


@dataclass
class Run:
    """One nmt-eval run: its report's first system and its decoded translations."""

    system: dict[str, Any]
    translations: list[dict[str, Any]]

    @staticmethod
    def load(folder: Path) -> Run:
        system: dict[str, Any] = json.loads((folder / "report.json").read_text())["systems"][0]
        decoded = json.loads((folder / system["label"] / "decoded.json").read_text())
        return Run(system, decoded["decoded"]["translations"])

    def row(self, label: str, sources: list[str]) -> str:
        o = self.system["overall"]
        texts = [t["text"] for t in self.translations]
        n = max(len(texts), 1)

        def share(k: int) -> str:
            return f"{100 * k / n:.1f}%"

        lc = sum(isometric_compliant(s, t) for s, t in zip(sources, texts, strict=False))
        cut = sum(bool(t.get("truncated")) for t in self.translations)
        chosen = [c for t in self.translations for c in t.get("candidates", []) if c["chosen"]]
        complies = share(sum(c["complies"] for c in chosen)) if chosen else "–"
        rows = sum(max(len(t.get("candidates", [])), 1) for t in self.translations) / n
        ends, as_source = ending_counts(sources, texts)
        whole = sum(not t.get("truncated") and sentence_end(t["text"]) in SENTENCE_ENDS for t in self.translations)
        return (
            f"| {label} | {o['bleu']['score']:.2f} ± {o['bleu']['ci']:.2f} | {o['chrf']['score']:.2f} | "
            f"{share(lc)} | {complies} | {share(ends)} | {share(as_source)} | {share(cut)} | {share(whole)} | "
            f"{rows:.1f} | {self.system['sentences_per_second']:.1f} |"
        )


def load_runs(out: Path, names: list[str]) -> tuple[dict[str, Run], int]:
    """The runs of `names` that `out` holds, and how many sentences they translated."""
    runs = {name: Run.load(out / name) for name in names if (out / name / "report.json").exists()}
    return runs, len(next(iter(runs.values())).translations) if runs else 0


def plain_row(label: str, texts: list[str], sources: list[str], references: list[str] | None) -> str:
    """A row for outputs that did not come from the engine (another system's, or the
    references themselves, `references` None): what the text alone says, BLEU and chrF by
    sacrebleu where there are references to score against."""
    n = max(len(texts), 1)

    def share(k: int) -> str:
        return f"{100 * k / n:.1f}%"

    lc = sum(isometric_compliant(s, t) for s, t in zip(sources, texts, strict=False))
    ends, as_source = ending_counts(sources, texts)
    bleu, chrf = "–", "–"
    if references is not None:
        import sacrebleu

        scored = sacrebleu.corpus_bleu(texts, [references[: len(texts)]])
        bleu = f"{scored.score:.2f}"
        chrf = f"{sacrebleu.corpus_chrf(texts, [references[: len(texts)]]).score:.2f}"
    return (
        f"| {label} | {bleu} | {chrf} | {share(lc)} | – | {share(ends)} | {share(as_source)} | – | {share(ends)} "
        "| – | – |"
    )


HEADER = (
    "| request | BLEU | chrF | LC | goal met | ends . ! ? | ends as source | cut | whole sentence, not cut "
    "| rows a text | sentences/s |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def examples(runs: dict[str, Run], sources: list[str], references: list[str]) -> list[str]:
    """Three verses at the three character asks, with their candidates' lengths."""
    lines: list[str] = []
    for i in (0, 1, 2):
        if i >= len(sources):
            break
        lines += [f"**{sources[i]}**  ", f"Reference ({len(references[i])} characters): {references[i]}", ""]
        for label, name in EXAMPLE_RUNS:
            if name not in runs:
                continue
            t = runs[name].translations[i]
            tried = ", ".join(
                f"{c['target_length']}→{c['characters']}{'*' if c['chosen'] else ''}" for c in t.get("candidates", [])
            )
            what = f"{len(t['text'])} characters; candidates, subwords→characters: {tried}"
            lines.append(f"- {label} ({what}): {t['text']}")
        lines.append("")
    return lines


def section(out: Path, sources: list[str], references: list[str], package: str) -> str:
    """The page's section: the table, what its columns mean, and the examples."""
    runs, n = load_runs(out, [name for _, name in RUNS])
    lines = [
        BEGIN,
        "## Lengths in characters: n-best over lengths",
        "",
        f"Written by `scripts/char-length-study.sh {package}` (nmt-eval through the server's engine, greedy "
        f"decoding, the first {n} sentences of the test books). A text with `target_chars` or `max_chars` is "
        "decoded at its natural length and at five lengths around the characters' estimate in subwords, as "
        "rows of one batch, each planned by the length encoding and ended by the model; when none complies, "
        "a second round aims at the sentence's own characters per subword, pulled to those lengths; the "
        "candidate the model scores best (mean log-probability per token) among those that comply is "
        "returned (under `max_chars` alone, one that ends as the source does first). Under `max_chars` alone, "
        "a row of a text whose source ends in sentence punctuation may end only right after the same "
        "punctuation, and until it has, the length rule's pull on its end goes to that punctuation instead "
        "(`engine/src/ending.rs`): where the rule would have stopped it mid-clause, it closes the sentence.",
        "",
        "LC: IWSLT 2022's length compliance against the source (characters without spaces within ±10%, or "
        "either side under 10). Goal met: the returned candidate meets the request's own goal (±10% of "
        "`target_chars`; within `max_chars`). Ends . ! ?: sentence punctuation, closing quotes aside; ends as "
        "source: the same sentence punctuation as the source, or none where it has none. Rows a text: "
        "candidates decoded per text (the cost). Sentences/s on this machine's CPU beside a training run: "
        "compare rows with one another only. Beside them, where the machine has Debian's `apertium-en-es` "
        "(a rule-based system, asked for no length), its translations of the same sources, and the references "
        "themselves measured against their sources.",
        "",
        HEADER,
    ]
    lines += [runs[name].row(label, sources) for label, name in RUNS if name in runs]
    apertium = out / "apertium.es"
    if apertium.exists():
        texts = apertium.read_text().split("\n")[:n]
        lines.append(
            plain_row("Apertium (rule-based, `apertium eng-spa`), as it translates", texts, sources, references)
        )
    lines.append(plain_row("the references themselves", references[:n], sources, None))
    lines += ["", "### Three verses", ""]
    lines += examples(runs, sources, references)
    lines.append(END)
    return "\n".join(lines) + "\n"


def update(page: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Puts `text` between the page's markers `begin` and `end`, or at its end when it has none."""
    old = page.read_text() if page.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        page.write_text(head + text + tail)
    else:
        page.write_text(old.rstrip("\n") + "\n\n" + text if old else text)


Section = Callable[[Path, list[str], list[str], str], str]


def collate_main(argv: list[str] | None, module: str, doc: str | None, section: Section, begin: str, end: str) -> int:
    """The command line of a study that collates nmt-eval reports into a page's section."""
    p = argparse.ArgumentParser(
        prog=f"python3 -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path, help="the folder of the study's nmt-eval reports")
    p.add_argument("sources", type=Path, help="the English side of the set (test.en)")
    p.add_argument("package", help="the package, as the page names it")
    p.add_argument("--references", type=Path, help="the Spanish side (default: SOURCES with .es)")
    p.add_argument("--page", type=Path, default=Path("docs/length-control.md"), help="the page to update")
    args = p.parse_args(argv)
    sources = args.sources.read_text().split("\n")
    references = (args.references or args.sources.with_suffix(".es")).read_text().split("\n")
    update(args.page, section(args.out, sources, references, args.package), begin, end)
    print(f"{module}: updated {args.page}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return collate_main(argv, MODULE, __doc__, section, BEGIN, END)


if __name__ == "__main__":
    sys.exit(main())
