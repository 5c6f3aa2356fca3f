"""Which of an isometric request's candidates to return: the server's rule beside others, scored
again from the candidates an nmt-eval run recorded, without decoding anything.

    python3 -m nmt_tools.studies.candidate_choice RUNS --corpus data/corpus-l10n --split test

RUNS holds two nmt-eval reports of the same split, as scripts/char-length-study.sh writes them:
`RUNS/default` (no length asked) and `RUNS/isometric` (`--target-chars source`), each with
`<package>/decoded.json`, whose translations list every candidate decoded for a text (its text,
summed-over-length score, output subwords, whether it complies and ended). Each rule picks one
compliant candidate per text (a text with none keeps what the server returned); the table gives
corpus BLEU (sacrebleu, as nmt-eval scores) and IWSLT 2022's length compliance (LC) of each.
Rules tuned here belong on a dev split; the test split only checks them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt_tools.studies.char_length import isometric_compliant

MODULE = "nmt_tools.studies.candidate_choice"
Candidate = dict[str, Any]
Rule = Callable[[list[Candidate], str], Candidate]
# Length-normalization exponents: summed log-probability over length**a (the server's score is
# the mean, a = 1).
EXPONENTS = (0.0, 0.5, 0.75, 1.0)


def summed(c: Candidate) -> float:
    return float(c["score"]) * max(1, int(c["output_tokens"]))


def normalized(a: float) -> Rule:
    return lambda ok, _default: max(ok, key=lambda c: summed(c) / max(1, int(c["output_tokens"])) ** a)


def natural_first(ok: list[Candidate], default: str) -> Candidate:
    """The default request's translation where it is among the compliant, else the best mean."""
    return next((c for c in ok if c["text"] == default), normalized(1.0)(ok, default))


def rules() -> list[tuple[str, Rule | None]]:
    """Each rule's name and how it picks; `None`: what the server returned."""
    return [
        ("as served (mean log-probability; no repeated phrase first)", None),
        ("the default request's translation where it complies", natural_first),
    ] + [(f"summed log-probability / length^{a:g}", normalized(a)) for a in EXPONENTS]


def choose(translations: list[dict[str, Any]], defaults: list[str], rule: Rule | None) -> list[str]:
    out = []
    for t, default in zip(translations, defaults, strict=True):
        ok = [c for c in t.get("candidates") or [] if c["complies"] and c["ended"]]
        out.append(t["text"] if rule is None or not ok else rule(ok, default)["text"])
    return out


def decoded(run: Path) -> list[dict[str, Any]]:
    (path,) = sorted(run.glob("*/decoded.json"))
    translations: list[dict[str, Any]] = json.loads(path.read_text())["decoded"]["translations"]
    return translations


def table(runs: Path, corpus: Path, split: str) -> str:
    import sacrebleu

    isometric = decoded(runs / "isometric")
    defaults = [t["text"] for t in decoded(runs / "default")]
    n = len(isometric)
    sources = (corpus / f"{split}.en").read_text().splitlines()[:n]
    references = (corpus / f"{split}.es").read_text().splitlines()[:n]

    def row(name: str, texts: list[str]) -> str:
        bleu = sacrebleu.corpus_bleu(texts, [references]).score
        lc = sum(isometric_compliant(s, t) for s, t in zip(sources, texts, strict=True)) / n
        return f"| {name} | {bleu:.2f} | {bleu - base:+.2f} | {100 * lc:.1f}% |"

    base = sacrebleu.corpus_bleu(defaults, [references]).score
    lines = [
        f"`{split}`, {n} texts ({runs}):",
        "",
        "| isometric request, candidate returned | BLEU | minus the default request's | LC |",
        "| --- | ---: | ---: | ---: |",
        row("the default request (no length asked)", defaults),
    ]
    lines += [row(name, choose(isometric, defaults, rule)) for name, rule in rules()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", type=Path, help="the folder with the `default` and `isometric` nmt-eval reports")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus-l10n"), help="the corpus nmt-eval read")
    p.add_argument("--split", default="test", help="the split both runs translated")
    args = p.parse_args(argv)
    sys.stdout.write(table(args.runs, args.corpus, args.split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
