"""Int8 against float32 for every preset: what quantization costs in quality and buys in
speed, through this engine, on the test books.

    source scripts/env.sh
    cargo build --release -p model-export -p nmt-eval -p nmt-bench
    python3 -m nmt_tools.int8.presets --packages runs/position-study/pkg/*.all \\
        --out-json docs/benchmarks/int8-presets.json --out-md docs/benchmarks/int8-presets.md

For each float32 package, `nmt-export quantize` writes its int8 twin (kept in --work and
reused while the float32 graphs are unchanged). `nmt-eval` then translates the test books with
both, as a request without options gets them (greedy; a length-aware package plans each
sentence's length with its predictor), and compares them: BLEU, chrF and TER with sacrebleu's
paired bootstrap against float32, and the share of identical outputs; the gate is
|delta BLEU| <= 0.5. Speed: --passes timing passes over the test verses at batch 1 and at
batch 32, each package in its own warmed-up `nmt-bench-worker` (the engine nmt_tools.ct2.compare
times), float32 and int8 alternating (ABBA...); target subwords per second, tokenization
included, medians. The position study's `-small` models stand in for the presets because they
are trained on real data for the same budget, so they can be compared; they are weaker than the
shipped model, which is measured the same way when given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from nmt_tools.machine import busy_processes, busy_summary, cpu_model, isa_flags, loadavg
from nmt_tools.paths import repo_root
from nmt_tools.provenance import command_line, git_state, utc_now
from nmt_tools.worker import Worker

MODULE = "nmt_tools.int8.presets"
GATE_BLEU = 0.5
METRICS = ("bleu", "chrf", "ter")
GRAPHS = ("encoder.onnx", "decoder.onnx")

Row = dict[str, Any]


def run(cmd: list[str], **kw: Any) -> None:  # noqa: ANN401 (subprocess.run's options)
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=repo_root(), **kw)


def manifest(package: str | Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((Path(package) / "manifest.json").read_text())
    return loaded


def int8_twin(args: argparse.Namespace, package: str, name: str) -> str:
    """The int8 twin of `package` in --work, quantized again only when the float32 graphs
    changed since (the twin's manifest records their checksums)."""
    out = os.path.join(args.work, "int8", name)
    source = manifest(package)
    if os.path.exists(os.path.join(out, "manifest.json")):
        made_from = manifest(out).get("quantization", {}).get("from", {})
        if all(made_from.get(g) == source["files"].get(g) for g in GRAPHS):
            return out
    run(
        [os.path.join(args.bin, "nmt-export"), "quantize", "--package", package, "--out", out, "--name", f"{name}-int8"]
    )
    return out


def evaluate(args: argparse.Namespace, packages: list[str], out: str) -> dict[str, Any]:
    run(
        [os.path.join(args.bin, "nmt-eval")]
        + [a for p in packages for a in ("--package", p)]
        + ["--split", "test", "--no-concat", "--bootstrap-samples", str(args.bootstrap_samples), "--out", out],
        stdout=subprocess.DEVNULL,
    )
    report: dict[str, Any] = json.loads(Path(out, "report.json").read_text())
    return report


def read_hypotheses(path: str) -> list[str]:
    return (Path(path) if os.path.isabs(path) else repo_root() / path).read_text(encoding="utf-8").splitlines()


def graph_bytes(package: str) -> int:
    return sum(os.path.getsize(os.path.join(package, g)) for g in GRAPHS)


def timing(args: argparse.Namespace, packages: dict[str, str], batch: int, work: str) -> dict[str, Any]:
    """Target subwords per second of each package's engine at this batch size: one warmed-up
    `nmt-bench-worker` per package, passes alternating between them (ABBA...)."""
    os.makedirs(work, exist_ok=True)
    workers: dict[str, Worker] = {}
    try:
        for precision, package in packages.items():
            command = [os.path.join(args.bin, "nmt-bench-worker"), "--verses", args.source, "engine"]
            command += ["--package", package, "--batch-size", str(batch), "--threads", "1"]
            log = os.path.join(work, f"worker-{precision}-b{batch}.log")
            workers[precision] = Worker(f"{precision}-b{batch}", command, log, dict(os.environ))
        rates: dict[str, list[float]] = {precision: [] for precision in packages}
        order = list(packages)
        for n in range(args.passes):
            for precision in order if n % 2 == 0 else reversed(order):
                done = workers[precision].run()
                rates[precision].append(done["output_tokens"] / done["seconds"])
    finally:
        for w in workers.values():
            w.stop()
    return {k: {"median": statistics.median(v), "passes": v} for k, v in rates.items()}


def measure(args: argparse.Namespace, package: str) -> Row:
    """One package's row: quality of its int8 twin against it, speed and size of both."""
    name = os.path.basename(os.path.normpath(package))
    config = manifest(package)["config"]
    twin = int8_twin(args, package, name)
    work = os.path.join(args.work, "eval", name)
    quality = evaluate(args, [package, twin], os.path.join(work, "quality"))
    f32, i8 = quality["systems"]
    bootstrap = quality["paired_bootstrap"]["systems"][1]
    f32_lines, i8_lines = read_hypotheses(f32["hypotheses"]), read_hypotheses(i8["hypotheses"])
    same = sum(a == b for a, b in zip(f32_lines, i8_lines, strict=False))
    # Keyed as the JSON keeps them, so a report read back renders the same.
    speed = {str(batch): timing(args, {"float32": package, "int8": twin}, batch, work) for batch in (1, 32)}
    quantization = manifest(twin)["quantization"]["graphs"]
    return {
        "package": package,
        "name": name,
        "preset": config["preset"],
        "int8_package": twin,
        "float32": {m: f32["overall"][m]["score"] for m in METRICS},
        "int8": {m: i8["overall"][m]["score"] for m in METRICS},
        "delta": {m: bootstrap[m]["delta"] for m in METRICS},
        "p_value": {m: bootstrap[m]["p_value"] for m in METRICS},
        "looping": {"float32": f32["overall"]["looping_share"], "int8": i8["overall"]["looping_share"]},
        "identical_outputs": same,
        "sentences": len(f32_lines),
        "tokens_per_second": speed,
        "graph_bytes": {"float32": graph_bytes(package), "int8": graph_bytes(twin)},
        "int8_products": {g: q["matmul_integer"] for g, q in quantization.items()},
        "float32_products": {g: q["weight_matmuls"] for g, q in quantization.items()},
    }


def header(r: dict[str, Any]) -> list[str]:
    earlier = sorted({x["measured"]["run"] for x in r["rows"]} - {r["date"]})
    isa = f" ({', '.join(r['isa'])})" if r.get("isa") else ""
    return [
        "# Int8 against float32, every preset",
        "",
        "Written by `python3 -m nmt_tools.int8.presets` (its `--help` says how it works).",
        "",
        f"- date: {r['date']}"
        + (f" (rows kept from earlier runs: {', '.join(earlier)}; each row's time in the JSON)" if earlier else ""),
        f"- command: `{r['command']}`",
        f"- git: {r['git']['commit']}" + (" (working tree with uncommitted changes)" if r["git"]["dirty"] else ""),
        f"- CPU: {r['cpu']}{isa}, {r['cores']} cores; load average at start {r['loadavg_start']}, "
        f"at end {r['loadavg_end']}",
        f"- also running at the start: {busy_summary(r['busy_start'])}",
        f"- timing: {r['passes']} passes per batch size, float32 and int8 alternating; one ONNX Runtime thread",
    ]


def quality_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Quality on the test books ({r['rows'][0]['sentences'] if r['rows'] else 0} verses, batches of 32): "
        f"sacrebleu, paired bootstrap of int8 against float32 ({r['bootstrap_samples']} resamples); the gate is "
        f"|ΔBLEU| ≤ {GATE_BLEU}.",
        "",
        "| preset | model | float32 BLEU | int8 BLEU | ΔBLEU (p) | ΔchrF | looping float32 → int8 | identical outputs "
        "| gate |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for x in r["rows"]:
        d, p = x["delta"], x["p_value"]
        lines.append(
            f"| `{x['preset']}` | `{x['name']}` | {x['float32']['bleu']:.2f} | {x['int8']['bleu']:.2f} | "
            f"{d['bleu']:+.2f} ({p['bleu']:.2f}) | {d['chrf']:+.2f} | "
            f"{100 * x['looping']['float32']:.1f}% → {100 * x['looping']['int8']:.1f}% | "
            f"{100 * x['identical_outputs'] / x['sentences']:.1f}% | "
            f"{'met' if abs(d['bleu']) <= GATE_BLEU else '**missed**'} |"
        )
    return lines


def speed_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Speed: target subwords per second (the server's engine and greedy loop in `nmt-bench-worker`, "
        "tokenization included), medians of the passes; size: encoder + decoder graphs; products: matrix "
        "products with stored weights, and how many the "
        "quantizer made integer (GRU and LSTM layers stay float32: ONNX Runtime has no integer GRU).",
        "",
        "| model | batch 1: float32 → int8 | ratio | batch 32: float32 → int8 | ratio | size float32 → int8 "
        "| integer products |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in r["rows"]:
        s = x["tokens_per_second"]
        cells = []
        for b in ("1", "32"):
            f, i = s[b]["float32"]["median"], s[b]["int8"]["median"]
            cells += [f"{f:.0f} → {i:.0f}", f"{i / f:.2f}x"]
        size = x["graph_bytes"]
        products = sum(x["int8_products"].values()), sum(x["float32_products"].values())
        lines.append(
            f"| `{x['name']}` | {' | '.join(cells)} | {size['float32'] / 1e6:.1f} → {size['int8'] / 1e6:.1f} MB | "
            f"{products[0]} of {products[1]} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    return "\n".join(header(report) + quality_table(report) + speed_table(report)) + "\n"


def merged_rows(rows: list[Row], out_json: str) -> list[Row]:
    """Rows of an earlier run for models not measured now stay, each with its own date."""
    earlier = json.loads(Path(out_json).read_text())
    fresh = {r["name"]: r for r in rows}
    merged = [fresh.pop(r["name"], None) or r for r in earlier["rows"]]
    return merged + list(fresh.values())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--packages", nargs="+", required=True, help="float32 model packages, one row each")
    p.add_argument("--work", default="runs/int8-presets", help="int8 twins and nmt-eval outputs")
    p.add_argument("--passes", type=int, default=4, help="timing passes per batch size (float32 and int8 each)")
    p.add_argument("--source", default="data/corpus/test.en", help="the verses timed, one a line")
    p.add_argument("--bootstrap-samples", type=int, default=1000, help="paired bootstrap resamples of the quality run")
    p.add_argument("--bin", default="target/release", help="where nmt-export, nmt-eval and nmt-bench-worker are")
    p.add_argument("--out-json", help="write the numbers here")
    p.add_argument("--out-md", help="write the tables here")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of --out-json for models not measured in this run (each row records when it was measured)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = {"date": utc_now(), "loadavg": loadavg(), "busy": busy_processes()}
    rows = []
    for package in args.packages:
        row = measure(args, package)
        row["measured"] = {"run": start["date"], "date": utc_now(), "loadavg_end": loadavg()}
        rows.append(row)
    if args.merge and args.out_json and os.path.exists(args.out_json):
        rows = merged_rows(rows, args.out_json)
    report = {
        "date": start["date"],
        "command": command_line(MODULE),
        "git": git_state(),
        "cpu": cpu_model(),
        "isa": isa_flags(),
        "cores": os.cpu_count(),
        "loadavg_start": start["loadavg"],
        "loadavg_end": loadavg(),
        "busy_start": start["busy"],
        "passes": args.passes,
        "bootstrap_samples": args.bootstrap_samples,
        "rows": rows,
    }
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report, indent=1))
    text = markdown(report)
    if args.out_md:
        Path(args.out_md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
