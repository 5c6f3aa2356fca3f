"""Collates the nmt-eval reports of scripts/exact-ending-study.sh (exact mode at the
reference's length, `--exact-plans` 0, 1, 4 and 10) into the section of
docs/length-control.md between its `exact endings` markers.

    python3 -m nmt_tools.studies.exact_endings OUT SOURCES PACKAGE [--page docs/length-control.md]

OUT holds one nmt-eval report per run (`plans0`, `plans1`, `plans4`, `plans10`: the names the
script gives them), SOURCES the English side of the set they translated, PACKAGE the package's
path as the page names it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt_tools.studies.char_length import Run, collate_main, ending_counts, load_runs

MODULE = "nmt_tools.studies.exact_endings"
BEGIN = "<!-- exact endings: begin (python3 -m nmt_tools.studies.exact_endings) -->"
END = "<!-- exact endings: end -->"
RUNS = [
    ("`--exact-plans 0`: the count alone, no closer (before)", "plans0"),
    ("`--exact-plans 1`: one row, told the count less 1", "plans1"),
    ("`--exact-plans 4` (the default)", "plans4"),
    ("`--exact-plans 10`", "plans10"),
]
EXAMPLE_RUNS = [("no closer", "plans0"), ("one row", "plans1"), ("default (4 rows)", "plans4")]
HEADER = (
    "| exact mode | BLEU | chrF | ends . ! ? | ends as source | closed by the model | rows a text | sentences/s |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def row(run: Run, label: str, sources: list[str]) -> str:
    o = run.system["overall"]
    texts = [t["text"] for t in run.translations]
    n = max(len(texts), 1)

    def share(k: int) -> str:
        return f"{100 * k / n:.1f}%"

    ends, as_source = ending_counts(sources, texts)
    chosen = [c for t in run.translations for c in t.get("candidates", []) if c["chosen"]]
    closed = share(sum(c["ended"] for c in chosen)) if chosen else "–"
    rows = sum(max(len(t.get("candidates", [])), 1) for t in run.translations) / n
    return (
        f"| {label} | {o['bleu']['score']:.2f} ± {o['bleu']['ci']:.2f} | {o['chrf']['score']:.2f} | "
        f"{share(ends)} | {share(as_source)} | {closed} | {rows:.1f} | {run.system['sentences_per_second']:.1f} |"
    )


def examples(runs: dict[str, Run], sources: list[str], references: list[str]) -> list[str]:
    """Three verses in each mode, with the default's candidates (planned length, closed by the model)."""
    lines: list[str] = []
    for i in (0, 1, 2):
        if i >= len(sources):
            break
        lines += [f"**{sources[i]}**  ", f"Reference: {references[i]}", ""]
        for label, name in EXAMPLE_RUNS:
            if name not in runs:
                continue
            t = runs[name].translations[i]
            tried = ", ".join(
                f"{c.get('planned_length') or c['target_length']}{' closed' if c['ended'] else ''}"
                f"{'*' if c['chosen'] else ''}"
                for c in t.get("candidates", [])
            )
            what = f"{t['output_tokens']} subwords" + (f"; told: {tried}" if tried else "")
            lines.append(f"- {label} ({what}): {t['text']}")
        lines.append("")
    return lines


def section(out: Path, sources: list[str], references: list[str], package: str) -> str:
    runs, n = load_runs(out, [name for _, name in RUNS])
    lines = [
        BEGIN,
        "## Exact lengths that end well",
        "",
        f"Written by `scripts/exact-ending-study.sh {package}` (nmt-eval through the server's engine, greedy "
        f"decoding, {n} sentences of the test books, `target_length` = the reference's subwords, `length_mode` "
        "exact). Forced to a count, a length-aware model that plans a little short ends its sentence early and "
        'pads the count with the start of another ("... el sueño. Y el"). Exact mode now ends a text whose '
        "source ends in sentence punctuation on the same punctuation at the count, holds those closers back in "
        "the 4 subwords before it (an early end there leaves a fragment), and decodes it in `--exact-plans` "
        "rows, each telling the length encoding a length around the count (told a little less, the model plans "
        "to end near the count, finds its closers held back and carries the sentence on to it); the row whose "
        "closer the model chose itself (its argmax at the last position) and that scores best is returned, "
        "else the best-scoring row. The offsets, most useful first (-1, -3, -5, 3, ...), were chosen on the "
        "Bible dev books, not these.",
        "",
        "Ends . ! ?: sentence punctuation, closing quotes aside; ends as source: the same sentence punctuation "
        "as the source (. ! ? … : ;), or none where it has none; closed by the model: the returned row's "
        "closer was the model's own first choice; rows a text: the cost. Sentences/s on this machine's CPU "
        "beside a training run: compare rows with one another only.",
        "",
        HEADER,
    ]
    lines += [row(runs[name], label, sources) for label, name in RUNS if name in runs]
    lines += ["", "### Three verses", ""]
    lines += examples(runs, sources, references)
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return collate_main(argv, MODULE, __doc__, section, BEGIN, END)


if __name__ == "__main__":
    sys.exit(main())
