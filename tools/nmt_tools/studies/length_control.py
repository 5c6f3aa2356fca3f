"""The two sections of docs/length-control.md that scripts/length-control.sh writes beside the
character and exact-ending studies: the length predictors' table, and the throughput of each
request kind.

    python3 -m nmt_tools.studies.length_control predictors --package P [--package Q ...]
    python3 -m nmt_tools.studies.length_control throughput BENCH_JSON --package P

`predictors` reads what `nmt-export length-predictor` measured and recorded in each package's
manifest (`length_prediction.predictor.evaluation`: per split, the predictor, the linear fit and
the source's length against the reference's length in the package's target subwords) and sets it
beside the figures issue 31 was filed with. `throughput` reads the JSON of `nmt-bench
--request-kinds` (one server per kind, cells interleaved) and gives each kind's sentences/s and
target subwords/s beside the default request's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nmt_tools.studies.char_length import update

MODULE = "nmt_tools.studies.length_control"
PREDICTORS_BEGIN = "<!-- predictors: begin (python3 -m nmt_tools.studies.length_control predictors) -->"
PREDICTORS_END = "<!-- predictors: end -->"
THROUGHPUT_BEGIN = "<!-- request kinds: begin (python3 -m nmt_tools.studies.length_control throughput) -->"
THROUGHPUT_END = "<!-- request kinds: end -->"
# The splits `nmt-export length-predictor` evaluates, in the table's order.
SPLITS = [
    ("test", "Bible test books"),
    ("test_concat", "test verses joined (2, 4, 8)"),
    ("l10n-test", "held-out catalogs"),
    ("dev", "Bible dev books"),
]
ESTIMATES = [("source_length", "the source's length"), ("linear_fit", "linear fit"), ("predictor", "the predictor")]
Json = dict[str, Any]


def predictor_rows(name: str, manifest: Json) -> list[str]:
    """One row per (split, estimate) that the package's manifest records."""
    prediction = manifest.get("length_prediction") or {}
    predictor = prediction.get("predictor") or {}
    evaluation = predictor.get("evaluation") or {}
    kind = predictor.get("computes", "none")
    seconds = (predictor.get("training") or {}).get("graph_seconds_per_source")
    cost = "–" if seconds is None else f"{seconds * 1e3:.4f}"
    rows = []
    for split, split_name in SPLITS:
        figures = evaluation.get(split)
        if not figures:
            continue
        baseline = (figures.get("source_length") or {}).get("error_variance")
        for key, label in ESTIMATES:
            f = figures.get(key)
            if not f:
                continue
            what = f"{label} (`{kind}`)" if key == "predictor" else label
            ratio = f"{f['error_variance'] / baseline:.2f}" if baseline else "–"
            rows.append(
                f"| `{name}` | {split_name} ({f['count']}) | {what} | {f['mean_error']:+.2f} | "
                f"{f['error_variance']:.2f} | {ratio} | {f['correlation']:.3f} | "
                f"{f['mean_absolute_error']:.2f} | {cost if key == 'predictor' else '0'} |"
            )
    return rows


def predictors_section(packages: list[Path]) -> str:
    lines = [
        PREDICTORS_BEGIN,
        "## The length predictors",
        "",
        "Written by `scripts/length-control.sh` from what `nmt-export length-predictor` measured "
        "and recorded in each package's manifest: the error of each estimate of the reference "
        "translation's length in the package's target subwords (EOS not counted; mean, variance "
        "and its ratio to the source length's, Pearson r, mean absolute error), and the "
        "predictor graph's cost per sentence on one core. Issue 31 was filed with the Bible "
        "model's MiniLM predictor at 31.05 against the source length's 34.06 (ratio 0.91) on 843 "
        "inputs; Oka et al.'s fine-tuned BERT reached 19.92 against 72.45 (0.27); the goal is a "
        "ratio of at most 0.5.",
        "",
        "| package | set | estimate | mean error | variance | ratio | r | MAE | ms per sentence |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for package in packages:
        manifest = json.loads((package / "manifest.json").read_text())
        lines += predictor_rows(str(manifest.get("name", package.name)), manifest)
    lines.append(PREDICTORS_END)
    return "\n".join(lines) + "\n"


def throughput_section(report: Json, package: str) -> str:
    """Each request kind's throughput at each concurrency, and its ratio to the default's."""
    cells = {(r["mode"], r["clients"]): r for r in report["results"]}
    kinds = [m["mode"] for m in report["server_args"]]
    fields = {m["mode"]: m.get("request_fields") for m in report["server_args"]}
    levels = sorted({r["clients"] for r in report["results"]})
    rss = dict(report.get("peak_rss_mib", []))
    base = kinds[0]
    header = "| request | fields | " + " | ".join(f"{c} client{'s' * (c > 1)}: sentences/s (× first)" for c in levels)
    header += " | " + " | ".join(f"{c}: subwords/s" for c in levels) + " | peak RSS |"
    lines = [
        THROUGHPUT_BEGIN,
        "## Throughput by request kind",
        "",
        f"Written by `scripts/length-control.sh` (`nmt-bench --request-kinds`; {report['date']}; "
        f"`{package}`, {report['verses']} inputs from `{report['verses_file']}`, one request "
        f"each; {report['nproc']} CPUs shared by server and clients): one server per kind, "
        f"side by side, cells of {report['warmup_seconds']:g} s warm-up and "
        f"{report['seconds']:g} s measured, interleaved by concurrency level. Sentences/s are "
        "requests/s (one text each); subwords/s count the target subwords the server reports.",
        "",
        header,
        "| --- | --- | " + " | ".join("---:" for _ in levels * 2) + " | ---: |",
    ]
    for kind in kinds:
        rates, tokens = [], []
        for c in levels:
            cell, first = cells.get((kind, c)), cells.get((base, c))
            if cell is None:
                rates.append("–")
                tokens.append("–")
                continue
            ratio = f" ({cell['requests_per_second'] / first['requests_per_second']:.2f}x)" if first else ""
            rates.append(f"{cell['requests_per_second']:.2f}{ratio}")
            tokens.append(f"{cell['tokens_per_second']:.0f}")
        peak = rss.get(kind)
        lines.append(
            f"| {kind} | `{json.dumps(fields.get(kind) or {})}` | "
            + " | ".join(rates + tokens)
            + f" | {'–' if peak is None else f'{peak:.0f} MiB'} |"
        )
    lines.append(THROUGHPUT_END)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    pred = sub.add_parser("predictors", help="the length predictors' table, from the packages' manifests")
    pred.add_argument("--package", type=Path, action="append", required=True, help="a model package (repeatable)")
    thr = sub.add_parser("throughput", help="each request kind's throughput, from nmt-bench --request-kinds")
    thr.add_argument("bench_json", type=Path, help="nmt-bench --out-json of a --request-kinds run")
    thr.add_argument("--package", required=True, help="the package the servers ran, as the page names it")
    for s in (pred, thr):
        s.add_argument("--page", type=Path, default=Path("docs/length-control.md"), help="the page to update")
    args = p.parse_args(argv)
    if args.command == "predictors":
        update(args.page, predictors_section(args.package), PREDICTORS_BEGIN, PREDICTORS_END)
    else:
        report = json.loads(args.bench_json.read_text())
        update(args.page, throughput_section(report, args.package), THROUGHPUT_BEGIN, THROUGHPUT_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
