"""Collates the nmt-eval reports of scripts/length-study.sh into Markdown (stdout).

    python3 -m nmt_tools.studies.length_study OUT BASELINE AWARE [PULL...] > docs/length-control.md

OUT holds one nmt-eval report per run (`baseline.free`, `aware.auto`, ...: the names
scripts/length-study.sh gives them); BASELINE and AWARE are the two packages' paths, as shown
on the page; each PULL adds the rows of the length-pull sweep run with it. A note under the
title comes from --note (default: $LENGTH_STUDY_NOTE).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

MODULE = "nmt_tools.studies.length_study"

HEADER = (
    "| system, length from | BLEU | chrF | LR | VAR | ±1 | ±2 | at | punct. | loop | cut | longest |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)
BY_ORIGIN = [
    ("baseline, free decoding", "baseline.free"),
    ("baseline, reference (exact)", "baseline.reference.exact"),
    ("length-aware, predictor (`auto`)", "aware.auto"),
    ("length-aware, source", "aware.source"),
    ("length-aware, reference (soft)", "aware.reference"),
    ("length-aware, reference (exact)", "aware.reference.exact"),
]
SUBTITLES = [
    ("baseline, 0.8 × reference (exact)", "baseline.subtitle.exact"),
    ("length-aware, 0.8 × reference (soft)", "aware.subtitle"),
    ("length-aware, 1.2 × reference (soft)", "aware.longer"),
    ("baseline, `max_chars` 42 (exact)", "baseline.chars42.exact"),
    ("length-aware, `max_chars` 42 (soft)", "aware.chars42"),
]
EXAMPLES = [
    ("baseline, free", "baseline.free"),
    ("baseline, 0.8 × ref, exact", "baseline.subtitle.exact"),
    ("aware, 0.8 × ref", "aware.subtitle"),
    ("aware, reference length", "aware.reference"),
    ("aware, 1.2 × ref", "aware.longer"),
    ("aware, `max_chars` 42", "aware.chars42"),
]


class Runs:
    """The nmt-eval reports of one length study, by run name."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def report(self, name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.out / name / "report.json").read_text())
        return loaded

    def system(self, name: str) -> dict[str, Any]:
        first: dict[str, Any] = self.report(name)["systems"][0]
        return first

    def hypotheses(self, name: str) -> list[str]:
        return Path(self.system(name)["hypotheses"]).read_text().split("\n")

    def row(self, label: str, name: str) -> str:
        o = self.system(name)["overall"]
        control = o.get("length_control") or {}
        within = (
            f"{pct(control['within_1_share'])} | {pct(control['within_2_share'])} | {pct(control['exact_share'])}"
            if control
            else "– | – | –"
        )
        return (
            f"| {label} | {o['bleu']['score']:.2f} ± {o['bleu']['ci']:.2f} | {o['chrf']['score']:.2f} | "
            f"{o['length_ratio']:.3f} | {o['subword_diff_variance']:.1f} | {within} | "
            f"{pct(o['ends_in_punctuation_share'])} | {pct(o['looping_share'])} | "
            f"{control.get('truncated', '–')} | {control.get('max_chars_seen', '–')} |"
        )


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def introduction(runs: Runs, baseline: str, aware: str, note: str | None) -> list[str]:
    first = runs.report("baseline.free")
    lines = ["# Length control, measured\n"]
    if note:
        lines.append("> " + note + "\n")
    lines += [
        "Written by `scripts/length-study.sh` (nmt-eval through the server's engine and length "
        "rules, greedy decoding, the test books unless a `--limit` was given: "
        f"{first['set']['sentences']} sentences). Baseline: `{baseline}` "
        f"(preset `{runs.system('baseline.free')['package']['preset']}`, no length encoding: lengths "
        f"are forced in exact mode). Length-aware: `{aware}` "
        f"(preset `{runs.system('aware.auto')['package']['preset']}`).\n",
        "BLEU: sacrebleu 13a with its 95% bootstrap interval. LR: output/reference length "
        "(sacrebleu's, in words). VAR: variance of output minus reference subwords (Oka et al.'s "
        "VAR). ±1 / ±2 / at: shares of outputs within 1 and 2 subwords of the asked length and "
        "exactly at it. Punct.: outputs ending in punctuation (`. , ; : ! ?`). Loop: outputs "
        "repeating a word 3-gram 3+ times. Cut / longest: outputs cut to meet `max_chars`, and "
        "the longest output in characters.\n",
    ]
    return lines


def tables(runs: Runs, pulls: list[str]) -> list[str]:
    lines = ["## BLEU, LR and VAR by where the length comes from\n", HEADER]
    lines += [runs.row(label, name) for label, name in BY_ORIGIN]
    lines += ["\n## The subtitle case\n", HEADER]
    lines += [runs.row(label, name) for label, name in SUBTITLES]
    if pulls:
        lines += [
            "\n## Soft mode's pull toward the asked length\n",
            "`nmt-server --length-pull P` (`NMT_LENGTH_PULL`): in soft mode, for a length the request "
            "asked for (a number, `source`, `max_chars`; a predicted length only where the package "
            "sets `prediction_pull`, and then only beyond that share of it), P logits per "
            "subword are taken from EOS for every subword short of the length minus one, and given "
            "to it for every subword past the length plus one. The length encoding still plans the "
            "sentence; the pull trades sentence endings (punct.) and BLEU for precision (VAR, ±1, ±2). "
            "The rows above use the server's default.\n",
            HEADER,
        ]
        lines += [runs.row(f"length-aware, reference (soft), pull {p}", f"aware.reference.pull{p}") for p in pulls]
        lines += [runs.row(f"length-aware, 0.8 × reference (soft), pull {p}", f"aware.subtitle.pull{p}") for p in pulls]
    return lines


def examples(runs: Runs) -> list[str]:
    first = runs.report("baseline.free")
    sources = Path(first["set"]["source"]).read_text().split("\n")
    references = Path(first["set"]["reference"]).read_text().split("\n")
    texts = {name: runs.hypotheses(name) for _, name in EXAMPLES}
    lines = ["\n## One verse at three lengths\n"]
    # Verses of middle length show the planning best: long enough to shorten, short enough to read.
    picked = [i for i, s in enumerate(sources) if 80 <= len(s) <= 140][:4]
    for i in picked:
        lines.append(f"**{sources[i]}**  \nReference: {references[i]}\n")
        lines += [f"- {label}: {texts[name][i]}" for label, name in EXAMPLES]
        lines.append("")
    return lines


def markdown(out: Path, baseline: str, aware: str, pulls: list[str], note: str | None) -> str:
    runs = Runs(out)
    lines = introduction(runs, baseline, aware, note) + tables(runs, pulls) + examples(runs)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path, help="the folder of the study's nmt-eval reports")
    p.add_argument("baseline", help="the baseline package, as the page names it")
    p.add_argument("aware", help="the length-aware package, as the page names it")
    p.add_argument("pulls", nargs="*", help="the --length-pull values swept")
    p.add_argument("--note", default=os.environ.get("LENGTH_STUDY_NOTE"), help="a note printed under the title")
    args = p.parse_args(argv)
    sys.stdout.write(markdown(args.out, args.baseline, args.aware, args.pulls, args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
