"""Collates the nmt-eval reports of scripts/length-study.sh into Markdown (stdout)."""

import json
import os
import pathlib
import sys

out, baseline, aware = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
pulls = sys.argv[4:]


def report(name):
    return json.loads((out / name / "report.json").read_text())


def system(name):
    return report(name)["systems"][0]


def hypotheses(name):
    return pathlib.Path(system(name)["hypotheses"]).read_text().split("\n")


def pct(x):
    return f"{100 * x:.1f}%"


def row(label, name):
    s = system(name)
    o = s["overall"]
    control = o.get("length_control") or {}
    within = (
        f"{pct(control['within_1_share'])} | {pct(control['within_2_share'])} | "
        f"{pct(control['exact_share'])}"
        if control
        else "– | – | –"
    )
    return (
        f"| {label} | {o['bleu']['score']:.2f} ± {o['bleu']['ci']:.2f} | {o['chrf']['score']:.2f} | "
        f"{o['length_ratio']:.3f} | {o['subword_diff_variance']:.1f} | {within} | "
        f"{pct(o['ends_in_punctuation_share'])} | {pct(o['looping_share'])} | "
        f"{control.get('truncated', '–')} | {control.get('max_chars_seen', '–')} |"
    )


first = report("baseline.free")
print("# Length control, measured\n")
note = os.environ.get("LENGTH_STUDY_NOTE")
if note:
    print("> " + note + "\n")
print(
    "Written by `scripts/length-study.sh` (nmt-eval through the server's engine and length "
    "rules, greedy decoding, the test books unless a `--limit` was given: "
    f"{first['set']['sentences']} sentences). Baseline: `{baseline}` "
    f"(preset `{system('baseline.free')['package']['preset']}`, no length encoding: lengths "
    f"are forced in exact mode). Length-aware: `{aware}` "
    f"(preset `{system('aware.auto')['package']['preset']}`).\n"
)
print(
    "BLEU: sacrebleu 13a with its 95% bootstrap interval. LR: output/reference length "
    "(sacrebleu's, in words). VAR: variance of output minus reference subwords (Oka et al.'s "
    "VAR). ±1 / ±2 / at: shares of outputs within 1 and 2 subwords of the asked length and "
    "exactly at it. Punct.: outputs ending in punctuation (`. , ; : ! ?`). Loop: outputs "
    "repeating a word 3-gram 3+ times. Cut / longest: outputs cut to meet `max_chars`, and "
    "the longest output in characters.\n"
)
header = (
    "| system, length from | BLEU | chrF | LR | VAR | ±1 | ±2 | at | punct. | loop | cut | longest |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)
print("## BLEU, LR and VAR by where the length comes from\n")
print(header)
for label, name in [
    ("baseline, free decoding", "baseline.free"),
    ("baseline, reference (exact)", "baseline.reference.exact"),
    ("length-aware, predictor (`auto`)", "aware.auto"),
    ("length-aware, source", "aware.source"),
    ("length-aware, reference (soft)", "aware.reference"),
    ("length-aware, reference (exact)", "aware.reference.exact"),
]:
    print(row(label, name))
print("\n## The subtitle case\n")
print(header)
for label, name in [
    ("baseline, 0.8 × reference (exact)", "baseline.subtitle.exact"),
    ("length-aware, 0.8 × reference (soft)", "aware.subtitle"),
    ("length-aware, 1.2 × reference (soft)", "aware.longer"),
    ("baseline, `max_chars` 42 (exact)", "baseline.chars42.exact"),
    ("length-aware, `max_chars` 42 (soft)", "aware.chars42"),
]:
    print(row(label, name))

if pulls:
    print("\n## Soft mode's pull toward the asked length\n")
    print(
        "`nmt-server --length-pull P` (`NMT_LENGTH_PULL`): in soft mode, for a length the request "
        "asked for (a number, `source`, `max_chars`; never a predicted length), P logits per "
        "subword are taken from EOS for every subword short of the length minus one, and given "
        "to it for every subword past the length plus one. The length encoding still plans the "
        "sentence; the pull trades sentence endings (punct.) and BLEU for precision (VAR, ±1, ±2). "
        "The rows above use the server's default.\n"
    )
    print(header)
    for pull in pulls:
        print(row(f"length-aware, reference (soft), pull {pull}", f"aware.reference.pull{pull}"))
    for pull in pulls:
        print(row(f"length-aware, 0.8 × reference (soft), pull {pull}", f"aware.subtitle.pull{pull}"))

sources = pathlib.Path(first["set"]["source"]).read_text().split("\n")
references = pathlib.Path(first["set"]["reference"]).read_text().split("\n")
runs = [
    ("baseline, free", "baseline.free"),
    ("baseline, 0.8 × ref, exact", "baseline.subtitle.exact"),
    ("aware, 0.8 × ref", "aware.subtitle"),
    ("aware, reference length", "aware.reference"),
    ("aware, 1.2 × ref", "aware.longer"),
    ("aware, `max_chars` 42", "aware.chars42"),
]
texts = {name: hypotheses(name) for _, name in runs}
print("\n## One verse at three lengths\n")
# Verses of middle length show the planning best: long enough to shorten, short enough to read.
picked = [i for i, s in enumerate(sources) if 80 <= len(s) <= 140][:4]
for i in picked:
    print(f"**{sources[i]}**  \nReference: {references[i]}\n")
    for label, name in runs:
        print(f"- {label}: {texts[name][i]}")
    print()
