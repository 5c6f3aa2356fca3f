"""A small position study on disk: nmt-eval reports and training records shaped like the ones
scripts/position-study.sh leaves, with made-up figures chosen so that the findings reach
different verdicts (held, did not hold, inconclusive, not measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODELS = ["transformer", "transformer-learned", "rel-transformer", "rnn-transformer", "rr-transformer", "rnn-nmt"]
REPO = Path(__file__).resolve().parents[2]
THIRDS_MODELS = ["transformer", "rel-transformer"]
LENGTH_MODELS = ["ldpe", "ldpe-noise2", "lrpe", "lrpe-noise2"]
TERCILES = (20, 35)
CAP = 32


def score(run: str, k: int) -> float:
    """A BLEU score that differs by run and bucket, the same on every call."""
    return round(8.0 + (sum(map(ord, run)) % 23) * 0.37 + k * 0.91, 2)


def system(run: str, buckets: list[str], concat: bool) -> dict[str, Any]:
    s: dict[str, Any] = {
        "label": run,
        "hypotheses": f"runs/{run}.hyp",
        "overall": {
            "bleu": {"score": score(run, 0)},
            "length_ratio": 0.95 + (len(run) % 7) * 0.03,
            "subword_diff_variance": 10.0 + len(run) * 1.5,
            "ends_in_punctuation_share": 0.9 + (len(run) % 3) * 0.03,
            "length_control": {"within_1_share": 0.4 + (len(run) % 5) * 0.1, "within_2_share": 0.7},
        },
        "by_source_length": [
            {
                "bucket": b,
                "sentences": 100 + 10 * k,
                "bleu": {"score": score(run, k + 1)},
                "length_ratio": 1.1 - k * 0.05,
                "looping_share": 0.05 * k,
            }
            for k, b in enumerate(buckets)
        ],
        "concat": [],
    }
    if concat:
        s["concat"] = [
            {
                "n_verses": n,
                "concat": {"bleu": {"score": score(run, n)}, "looping_share": n / 20, "length_ratio": 1 - n / 20},
                "one_by_one": {"bleu": {"score": score(run, 1)}},
            }
            for n in (2, 4, 8)
        ]
    return s


def report(runs: list[str], buckets: list[str], concat: bool) -> dict[str, Any]:
    """An nmt-eval report whose paired tests are against the first run."""
    baseline, others = runs[0], runs[1:]
    p_values = [0.001, 0.2, 0.03, 0.5, 0.01]
    return {
        "systems": [system(r, buckets, concat) for r in runs],
        "paired_bootstrap": {
            "baseline": baseline,
            "by_bucket": [
                {"system": r, "bucket": b, "bleu_delta": 0.5, "bleu_p": p_values[(i + k) % len(p_values)]}
                for i, r in enumerate(others)
                for k, b in enumerate(buckets)
            ],
            "by_n_verses": [
                {"system": r, "n_verses": n, "bleu_delta": 0.5, "bleu_p": p_values[i % len(p_values)]}
                for i, r in enumerate(others)
                for n in (2, 4, 8)
            ],
            "systems": [
                {"label": r, "bleu": {"delta": 0.4 - i * 0.3, "p_value": p_values[i % len(p_values)]}}
                for i, r in enumerate(others)
            ],
        },
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def training_record(record: Path, runs: list[str]) -> None:
    for i, run in enumerate(runs):
        state = {
            "step": 1500,
            "train_pairs": 50000 - i,
            "train_seconds": 3600.0 + 60 * i,
            "last_dev_loss": 3.1 + i / 100,
            "target_tokens_seen": 4_200_000,
            "epoch": 2,
        }
        write_json(
            record / "runs" / run / "report.json",
            {"parameters": 1_000_000 + i, "target_tokens_per_second": 900.0 + i, "state": state},
        )
    (record / "runs" / runs[1] / "note.md").write_text("Trained beside another run.\n")


def write_study(root: Path) -> dict[str, Any]:
    """Writes the study under `root`; returns its folders and settings."""
    study, record = root / "study", root / "record"
    edges_all = ["1-16", "17-32", "33-64", "65+"]
    thirds = [f"1-{TERCILES[0]}", f"{TERCILES[0] + 1}-{TERCILES[1]}", f"{TERCILES[1] + 1}+"]
    write_json(study / "eval-all" / "report.json", report([f"{m}.all" for m in MODELS], edges_all, True))
    (study / "eval-all" / "bleu_by_length.png").write_bytes(b"\x89PNG not really")
    write_json(
        study / "eval-short" / "report.json", report([f"{m}.short" for m in MODELS], ["1-32", "33-64", "65+"], True)
    )
    for m in THIRDS_MODELS:
        runs = [f"{m}.third{k}" for k in (1, 2, 3)] + [f"{m}.all"]
        write_json(study / f"eval-thirds-{m}" / "report.json", report(runs, thirds, False))
    for k in (1, 2, 3):
        write_json(
            study / f"eval-third{k}" / "report.json", report([f"{m}.third{k}" for m in THIRDS_MODELS], thirds, False)
        )
    for src in ("auto", "source", "reference"):
        write_json(
            study / f"eval-length-{src}" / "report.json", report([f"{m}.all" for m in LENGTH_MODELS], edges_all, False)
        )
    runs = [f"{m}.{c}" for m in MODELS for c in ("all", "short")]
    runs += [f"{m}.third{k}" for m in THIRDS_MODELS for k in (1, 2, 3)]
    training_record(record, runs)
    return {"study": study, "record": record}


LENGTH_RUNS = [
    "baseline.free",
    "baseline.reference.exact",
    "baseline.subtitle.exact",
    "baseline.chars42.exact",
    "aware.auto",
    "aware.source",
    "aware.reference",
    "aware.reference.exact",
    "aware.subtitle",
    "aware.longer",
    "aware.chars42",
]
PULLS = ["0", "2"]


def write_length_study(root: Path) -> Path:
    """The nmt-eval reports of scripts/length-study.sh under `root`/out; returns that folder."""
    out = root / "out"
    sources = ["Short.", "x" * 90, "And the LORD spake unto Moses, saying, Speak unto the children of Israel here."]
    (root / "test.en").write_text("\n".join(sources) + "\n")
    (root / "test.es").write_text("\n".join(f"ref {i}" for i in range(len(sources))) + "\n")
    runs = LENGTH_RUNS + [f"aware.{kind}.pull{p}" for kind in ("reference", "subtitle") for p in PULLS]
    for i, run in enumerate(runs):
        hypotheses = root / f"{run}.hyp"
        hypotheses.write_text("\n".join(f"{run} says {k}" for k in range(len(sources))) + "\n")
        control = (
            {}
            if run == "baseline.free"
            else {
                "within_1_share": 0.5 + i / 100,
                "within_2_share": 0.8,
                "exact_share": 0.25,
                "truncated": i,
                "max_chars_seen": 40 + i,
            }
        )
        overall = {
            "bleu": {"score": 20 + i / 3, "ci": 0.5},
            "chrf": {"score": 45 + i / 7},
            "length_ratio": 1 + i / 50,
            "subword_diff_variance": 3.0 * i,
            "length_control": control or None,
            "ends_in_punctuation_share": 0.9,
            "looping_share": 0.01 * i,
        }
        system = {"hypotheses": str(hypotheses), "package": {"preset": run.split(".")[0]}, "overall": overall}
        document = {
            "set": {"sentences": len(sources), "source": str(root / "test.en"), "reference": str(root / "test.es")},
            "systems": [system],
        }
        write_json(out / run / "report.json", document)
    return out
