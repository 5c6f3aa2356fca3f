#!/usr/bin/env python3
"""This server against CTranslate2 on the same weights, side by side, in one run.

    source scripts/env.sh
    cargo build --release -p nmt-server -p nmt-bench -p model-export
    python3 -m pip install -r bench/ctranslate2/requirements.txt
    python3 bench/ctranslate2/compare.py --package PACKAGE \\
        --out-json docs/benchmarks/ctranslate2.json --out-md docs/benchmarks/ctranslate2.md

The package is converted to a CTranslate2 model (convert.py), and its int8 twin is written by
`nmt-export quantize` when that subcommand exists (or given with --int8-package). Every
configuration measured ("cell") runs in its own worker process, loaded and warmed up once and
kept for the whole run: CTranslate2's in this script (`ct2-worker`, a hidden subcommand), this
server's in `nmt-bench-worker` (its engine in-process, or nmt-server over HTTP with Rust
closed-loop clients, as nmt-bench drives it). The runner is Python because CTranslate2 is used
through its Python API, as its users use it; this side stays in Rust so that it is measured
through its own code, and so that 64 HTTP clients take as little CPU from the server they share
two cores with as nmt-bench's do. One pass translates every verse once; the
throughput is target subwords (EOS not counted) over the pass's wall time, tokenization and
detokenization included. Passes are interleaved: round 1 runs every cell once in order, round 2
in reverse order, and so on (ABBA...), so that drift in the machine's speed hits every cell
alike. Each cell reports the median of its passes and their range.

The outputs of each cell's first pass are kept (written after its clock stops) and compared
line by line with this engine's float32 greedy outputs at batch 1: the agreement check of the
conversion.
"""

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import ROOT, busy_processes, cpu_model, git_state  # noqa: E402
from worker import Worker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# nmt-server's decoding limits (`nmt-server --help`), read from the same variables it reads,
# so that CTranslate2 gets the output budget this server gives every sentence.
LIMIT_DEFAULTS = {
    "NMT_MAX_LENGTH_RATIO": 2.0,
    "NMT_MAX_LENGTH_OFFSET": 10,
    "NMT_MAX_INPUT_TOKENS": 1024,
    "NMT_MAX_OUTPUT_TOKENS": 1024,
}

MODE_TITLES = {
    "one": "1 at a time",
    "concurrent": "{clients} concurrent",
    "batch": "batches of {batch}",
}


def limit(name):
    value = os.environ.get(name)
    kind = type(LIMIT_DEFAULTS[name])
    return kind(value) if value is not None else LIMIT_DEFAULTS[name]


def read_verses(path):
    """The inputs as nmt-bench reads them (bench/src/verses.rs): a `.tsv` file by its `en`
    column, anything else every non-empty line, trimmed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.lower().endswith(".tsv"):
        lines = text.splitlines()
        col = [c.strip() for c in lines[0].split("\t")].index("en")
        verses = [line.split("\t")[col].strip() for line in lines[1:] if line.strip()]
        return [v for v in verses if v]
    return [line.strip() for line in text.splitlines() if line.strip()]


# --- CTranslate2's side -------------------------------------------------------------------


class Ct2Side:
    """A CTranslate2 translator that decodes as this server does: the package's tokenizer,
    the source with EOS appended (the converted model's add_source_eos), greedy search, the
    server's input limit and output budget."""

    def __init__(self, args):
        import ctranslate2
        import tokenizers

        with open(os.path.join(args.package, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        self.tokenizer = tokenizers.Tokenizer.from_file(
            os.path.join(args.package, "tokenizer.json")
        )
        self.ids = self.tokenizer.get_vocab(with_added_tokens=True)
        self.translator = ctranslate2.Translator(
            args.model,
            device="cpu",
            compute_type=args.compute_type,
            inter_threads=args.inter_threads,
            intra_threads=args.intra_threads,
        )
        source_limit = manifest["limits"].get("max_source_tokens")
        # As `nmt_server::server::model_input_limit`: the model's bound counts the EOS.
        self.input_limit = limit("NMT_MAX_INPUT_TOKENS")
        if source_limit is not None:
            self.input_limit = min(self.input_limit, source_limit - 1)
        self.max_output = min(limit("NMT_MAX_OUTPUT_TOKENS"), manifest["limits"]["max_target_tokens"])
        self.ratio = limit("NMT_MAX_LENGTH_RATIO")
        self.offset = limit("NMT_MAX_LENGTH_OFFSET")

    def budget(self, n):
        """`RequestLimits::output_budget`: ceil(ratio * n) + offset within 1..=max_output."""
        return min(max(math.ceil(self.ratio * n) + self.offset, 1), self.max_output)

    def tokenize(self, text):
        tokens = self.tokenizer.encode(text, add_special_tokens=False).tokens
        admitted = bool(text.strip()) and len(tokens) <= self.input_limit
        return tokens if admitted else None

    def detokenize(self, tokens):
        return self.tokenizer.decode([self.ids[t] for t in tokens], skip_special_tokens=True)

    def decode(self, batch, max_length):
        results = self.translator.translate_batch(
            batch,
            beam_size=1,
            max_decoding_length=max_length,
            min_decoding_length=0,
            max_input_length=0,
            return_scores=False,
        )
        return [r.hypotheses[0] for r in results]

    def one(self, text):
        """(translation, output tokens, hit the budget, refused) of one text."""
        tokens = self.tokenize(text)
        if tokens is None:
            return "", 0, False, True
        budget = self.budget(len(tokens))
        out = self.decode([tokens], budget)[0]
        return self.detokenize(out), len(out), len(out) >= budget, False

    def pass_one_by_one(self, texts):
        return [self.one(t) for t in texts]

    def pass_concurrent(self, texts, clients, pool):
        """`clients` threads, each taking the next text as soon as its previous one is done
        (what closed-loop clients do to a server); translate_batch releases the GIL."""
        results = [None] * len(texts)
        counter = iter(range(len(texts)))
        lock = threading.Lock()

        def client():
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                results[i] = self.one(texts[i])

        for f in [pool.submit(client) for _ in range(min(clients, len(texts)))]:
            f.result()
        return results

    def pass_batched(self, texts, batch_size):
        """Batches of `batch_size` sorted longest first, the order and batches this engine's
        `translate` makes. One decoding length serves a batch, so each batch runs to its
        longest budget and outputs are cut to their own budget (what this engine stops at)."""
        results = [None] * len(texts)
        pending = []
        for i, text in enumerate(texts):
            tokens = self.tokenize(text)
            if tokens is None:
                results[i] = ("", 0, False, True)
            else:
                pending.append((i, tokens))
        pending.sort(key=lambda p: (-len(p[1]), p[0]))
        for k in range(0, len(pending), batch_size):
            chunk = pending[k : k + batch_size]
            budgets = [self.budget(len(tokens)) for _, tokens in chunk]
            outs = self.decode([tokens for _, tokens in chunk], max(budgets))
            for (i, _), out, budget in zip(chunk, outs, budgets):
                out = out[:budget]
                results[i] = (self.detokenize(out), len(out), len(out) >= budget, False)
        return results


def ct2_worker(argv):
    p = argparse.ArgumentParser(prog="compare.py ct2-worker")
    p.add_argument("--model", required=True)
    p.add_argument("--package", required=True)
    p.add_argument("--verses", required=True)
    p.add_argument("--compute-type", required=True)
    p.add_argument("--intra-threads", type=int, required=True)
    p.add_argument("--inter-threads", type=int, default=1)
    p.add_argument("--mode", choices=["one", "concurrent", "batch"], required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=16)
    args = p.parse_args(argv)
    import ctranslate2

    side = Ct2Side(args)
    texts = read_verses(args.verses)
    pool = (
        concurrent.futures.ThreadPoolExecutor(args.clients) if args.mode == "concurrent" else None
    )

    def run(batch):
        if args.mode == "one":
            return side.pass_one_by_one(batch)
        if args.mode == "concurrent":
            return side.pass_concurrent(batch, args.clients, pool)
        return side.pass_batched(batch, args.batch_size)

    run(texts[: args.warmup])
    say({"ready": True, "ctranslate2": ctranslate2.__version__, "sentences": len(texts)})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] != "run":
            raise SystemExit(f"ct2-worker: unknown command {words[0]!r}")
        start = time.perf_counter()
        results = run(texts)
        seconds = time.perf_counter() - start
        refused = sum(r[3] for r in results)
        answer = {
            "sentences": len(results),
            "output_tokens": sum(r[1] for r in results),
            "seconds": seconds,
            "errors": refused,
            "hit_budget": sum(r[2] for r in results),
        }
        if refused:
            answer["error"] = f"{refused} inputs refused"
        if len(words) > 1:
            write_lines(words[1], [r[0] for r in results])
        say(answer)


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def write_lines(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(t.replace("\n", " ").replace("\r", " ") + "\n")


# --- the run ------------------------------------------------------------------------------


def cells_for(args, packages):
    """Every configuration to measure, in the order of a forward round: by precision, then by
    mode, CTranslate2's cells next to this side's, so that the cells compared with each other
    also run close together in time."""
    cells = []
    for precision in ("float32", "int8"):
        for mode in ("one", "concurrent", "batch"):
            layouts = [(1, t) for t in args.ct2_threads]
            if mode == "concurrent" and args.ct2_inter2:
                # CTranslate2's own way to use two cores for many clients: two replicas.
                layouts.append((2, 1))
            for inter, intra in layouts:
                cells.append(
                    {
                        "id": f"ct2-{precision}-{mode}-inter{inter}-intra{intra}",
                        "system": "CTranslate2",
                        "precision": precision,
                        "mode": mode,
                        "threads": f"intra {intra}" if inter == 1 else f"inter {inter} x intra {intra}",
                        "inter_threads": inter,
                        "intra_threads": intra,
                        "compute_type": precision,
                        "package": packages["float32"],
                    }
                )
            if precision not in packages:
                continue
            if mode in ("one", "batch"):
                batch = 1 if mode == "one" else args.batch_size
                for t in args.our_threads_one if mode == "one" else args.our_threads:
                    cells.append(
                        {
                            "id": f"engine-{precision}-{mode}-t{t}",
                            "system": "this engine (no HTTP)",
                            "precision": precision,
                            "mode": mode,
                            "threads": f"intra-op {t}",
                            "batch_size": batch,
                            "intra_threads": t,
                            "package": packages[precision],
                        }
                    )
            if mode in ("one", "concurrent"):
                clients = 1 if mode == "one" else args.clients
                layouts = [(1, t) for t in args.server_threads]
                if mode == "concurrent":
                    # The server's counterpart of CTranslate2's inter_threads: model workers.
                    layouts += [(w, 1) for w in args.server_workers if w > 1]
                for workers, t in layouts:
                    cells.append(
                        {
                            "id": f"server-{precision}-{mode}-t{t}" + (f"-w{workers}" if workers > 1 else ""),
                            "system": "this server (HTTP)",
                            "precision": precision,
                            "mode": mode,
                            "threads": f"intra-op {t}" if workers == 1 else f"{workers} workers x intra-op {t}",
                            "clients": clients,
                            "intra_threads": t,
                            "model_workers": workers,
                            "package": packages[precision],
                        }
                    )
    if args.reference_package:
        for mode in args.reference_modes:
            cells.append(
                {
                    "id": f"reference-{mode}",
                    "system": "this engine (no HTTP), shipped model",
                    "precision": "float32",
                    "mode": mode,
                    "threads": "intra-op 1",
                    "batch_size": 1 if mode == "one" else args.batch_size,
                    "intra_threads": 1,
                    "package": args.reference_package,
                    "reference": True,
                }
            )
    return cells


def worker_command(cell, args, ct2_model):
    if cell["system"] == "CTranslate2":
        return [
            sys.executable,
            os.path.abspath(__file__),
            "ct2-worker",
            "--model", ct2_model,
            "--package", cell["package"],
            "--verses", args.verses,
            "--compute-type", cell["compute_type"],
            "--intra-threads", str(cell["intra_threads"]),
            "--inter-threads", str(cell["inter_threads"]),
            "--mode", cell["mode"],
            "--clients", str(args.clients),
            "--batch-size", str(args.batch_size),
            "--warmup", str(args.warmup),
        ]
    common = [args.worker_bin, "--verses", args.verses, "--warmup", str(args.warmup)]
    if "clients" in cell:
        return common + [
            "http",
            "--package", cell["package"],
            "--clients", str(cell["clients"]),
            "--server-bin", args.server_bin,
            "--server-log", os.path.join(args.work, "logs", f"{cell['id']}.server.log"),
            f"--server-arg=--intra-op-threads",
            f"--server-arg={cell['intra_threads']}",
            "--server-arg=--model-workers",
            f"--server-arg={cell.get('model_workers', 1)}",
            "--server-arg=--device",
            "--server-arg=cpu",
        ]
    return common + [
        "engine",
        "--package", cell["package"],
        "--batch-size", str(cell["batch_size"]),
        "--threads", str(cell["intra_threads"]),
    ]


def int8_package(args):
    """The int8 twin: --int8-package, or `nmt-export quantize` when that subcommand exists."""
    if args.int8_package:
        return args.int8_package, "given with --int8-package"
    if args.no_int8:
        return None, "skipped (--no-int8)"
    help_text = subprocess.run(
        [args.export_bin, "--help"], capture_output=True, text=True, cwd=ROOT
    )
    if help_text.returncode != 0 or "quantize" not in help_text.stdout:
        return None, f"`{args.export_bin} quantize` does not exist (yet): no int8 package"
    out = os.path.join(args.work, "package-int8")
    command = [args.export_bin, "quantize", "--package", args.package, "--out", out]
    if os.path.exists(out):
        import shutil

        shutil.rmtree(out)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return None, f"`{shlex.join(command)}` failed: {done.stderr.strip()[-500:]}"
    return out, f"`{shlex.join(command)}`"


def agreement(reference, other):
    same = [i for i, (a, b) in enumerate(zip(reference, other)) if a == b]
    differ = [i for i in range(len(reference)) if i >= len(other) or reference[i] != other[i]]
    return {"agree": len(same), "of": len(reference), "differ": differ}


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def ct2_backend(model):
    """What CTranslate2 picked on this CPU (instruction set, GEMM backends), from its own log."""
    code = (
        "import ctranslate2, sys; "
        "ctranslate2.Translator(sys.argv[1], device='cpu', compute_type='int8')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, model],
        capture_output=True,
        text=True,
        env=dict(os.environ, CT2_VERBOSE="1"),
    )
    wanted = ("Selected ISA", "Use Intel MKL", "SGEMM backend", "GEMM_S8 backend")
    found = []
    for line in done.stderr.splitlines():
        for w in wanted:
            if w in line:
                found.append(line.split("]")[-1].strip(" -"))
    return "; ".join(found) or "unknown"


def summary(passes):
    rates = [p["output_tokens"] / p["seconds"] for p in passes]
    return {
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "tokens_per_second": rates,
        "output_tokens": [p["output_tokens"] for p in passes],
        "seconds": [p["seconds"] for p in passes],
        "hit_budget": [p.get("hit_budget") for p in passes],
    }


def fmt(s):
    return f"{s['median']:.0f} [{s['min']:.0f}-{s['max']:.0f}]" if s else "-"


def mode_title(mode, report):
    return MODE_TITLES[mode].format(clients=report["clients"], batch=report["batch_size"])


def ratios(report):
    """This side's median over CTranslate2's best median of the same precision: in the same
    mode, and over all modes."""
    cells = [c for c in report["cells"] if "result" in c and not c.get("reference")]
    out = []
    for precision in ("float32", "int8"):
        ct2 = [c for c in cells if c["system"] == "CTranslate2" and c["precision"] == precision]
        ours = [c for c in cells if c["system"] != "CTranslate2" and c["precision"] == precision]
        if not ct2 or not ours:
            continue
        best_any = max(ct2, key=lambda c: c["result"]["median"])
        for c in ours:
            same = [d for d in ct2 if d["mode"] == c["mode"]]
            best_same = max(same, key=lambda d: d["result"]["median"]) if same else None
            out.append(
                {
                    "precision": precision,
                    "cell": c["id"],
                    "system": c["system"],
                    "mode": c["mode"],
                    "threads": c["threads"],
                    "median": c["result"]["median"],
                    "ct2_best_same_mode": best_same and best_same["id"],
                    "ratio_same_mode": best_same
                    and c["result"]["median"] / best_same["result"]["median"],
                    "ct2_best": best_any["id"],
                    "ratio_best": c["result"]["median"] / best_any["result"]["median"],
                }
            )
    return out


def markdown(r):
    modes = ["one", "concurrent", "batch"]
    policy = r["ct2_omp_wait_policy"]
    lines = [
        "# This server against CTranslate2, same weights",
        "",
        "Written by `bench/ctranslate2/compare.py` (see its docstring for how it works).",
        "",
        f"- date: {r['date']}",
        f"- command: `{r['command']}`",
        f"- git: {r['git']['commit']}"
        + (" (working tree with uncommitted changes)" if r["git"]["dirty"] else ""),
        f"- CPU: {r['machine']['cpu']}, {r['machine']['nproc']} cores; load average at start "
        f"{r['machine']['loadavg_start']}, at end {r['machine']['loadavg_end']}",
        f"- versions: CTranslate2 {r['versions']['ctranslate2']} ({r['ct2_backend']}; "
        + (f"`OMP_WAIT_POLICY={policy}`" if policy else "libgomp's default wait policy")
        + f"), ONNX Runtime {r['versions']['onnxruntime']}, tokenizers (Python) "
        f"{r['versions']['tokenizers']}",
        f"- model: `{r['package']['path']}` ({r['package']['name']}, preset "
        f"`{r['package']['preset']}`), converted by `bench/ctranslate2/convert.py`; "
        "CTranslate2's int8 is `compute_type=\"int8\"` on that float32 model (weights "
        "quantized when it loads); this side's int8: "
        + (f"`{r['int8']['package']}` from {r['int8']['how']}" if r["int8"]["package"] else r["int8"]["how"]),
        f"- inputs: `{r['verses']}` ({r['sentences']} verses); a pass translates each once; "
        f"{r['passes']} passes per cell, interleaved (round 1 runs every cell once in the order "
        "of the table, round 2 in reverse, ...); every worker translated "
        f"{r['warmup']} verses before its first pass",
        f"- wall time of the run: {r['wall_seconds'] / 60:.1f} min",
    ]
    if r["machine"]["busy_start"]:
        busy = ", ".join(
            f"{p['command']} (nice {p['nice']}, {p['cpu_percent']:.0f}% of a core)"
            for p in r["machine"]["busy_start"]
        )
        lines.append(f"- also running at the start: {busy}")
    lines += [
        "",
        "Every cell decodes greedily with nmt-server's output budget, ceil("
        f"{r['limits']['NMT_MAX_LENGTH_RATIO']} x source subwords) + "
        f"{r['limits']['NMT_MAX_LENGTH_OFFSET']}, and counts target subwords (EOS not counted) "
        "over the pass's wall time, tokenization and detokenization included:",
        "",
        "- 1 at a time: CTranslate2 `translate_batch` with one sentence per call, one call after "
        "the other; this engine with batch size 1; this server with one closed-loop HTTP client.",
        f"- {r['clients']} concurrent: CTranslate2 from {r['clients']} Python threads, each "
        "calling `translate_batch` with one sentence as soon as its previous one is back "
        "(CTranslate2 does not batch separate calls: they queue for its `inter_threads` "
        f"replicas); this server with {r['clients']} closed-loop HTTP clients (continuous "
        "batching, its default).",
        f"- batches of {r['batch_size']}: the whole set sorted longest first and cut into "
        f"batches of {r['batch_size']}, the same batches on both sides (this engine's own "
        "order, as nmt-eval and nmt-translate run it); CTranslate2 decodes a batch up to its "
        "longest budget and each output is cut to its own budget, where this engine stops.",
    ]
    if r.get("reference_package"):
        lines.append(
            f"- shipped model: `{r['reference_package']}` through this engine, as a request "
            "without `target_length` gets it: its length predictor (BERT) plans every "
            "sentence's length before decoding. CTranslate2 cannot express its length-aware "
            "decoder."
        )
    lines += [
        "",
        "Target subwords per second, median [min-max] of the passes:",
        "",
        "| system | precision | threads | "
        + " | ".join(mode_title(m, r) for m in modes)
        + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in modes) + " |",
    ]
    rows = {}
    for c in r["cells"]:
        key = (c["system"], c["precision"], c["threads"])
        rows.setdefault(key, {})[c["mode"]] = c.get("result")
    # By precision, then CTranslate2's rows before this side's (cells run in another order).
    systems = ["CTranslate2", "this engine (no HTTP)", "this server (HTTP)"]
    first_seen = {key: i for i, key in enumerate(rows)}

    def row_order(key):
        system, precision, _ = key
        rank = systems.index(system) if system in systems else len(systems)
        return (rank == len(systems), precision != "float32", rank, first_seen[key])

    for system, precision, threads in sorted(rows, key=row_order):
        by_mode = rows[(system, precision, threads)]
        lines.append(
            f"| {system} | {precision} | {threads} | "
            + " | ".join(fmt(by_mode.get(m)) if m in by_mode else "" for m in modes)
            + " |"
        )
    failed = [c for c in r["cells"] if "failure" in c]
    if failed:
        lines += ["", "Cells that failed:", ""]
        lines += [f"- {c['id']}: {c['failure']}" for c in failed]
    lines += [
        "",
        "This side's median over CTranslate2's best median of the same precision, in the same "
        "column and in any column:",
        "",
        "| precision | system | threads | mode | tok/s | / CT2 best, same column | / CT2 best, any column |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for x in r["ratios"]:
        same = (
            f"{x['ratio_same_mode']:.2f} (`{x['ct2_best_same_mode']}`)"
            if x["ratio_same_mode"]
            else "-"
        )
        lines.append(
            f"| {x['precision']} | {x['system']} | {x['threads']} | {mode_title(x['mode'], r)} | "
            f"{x['median']:.0f} | {same} | {x['ratio_best']:.2f} (`{x['ct2_best']}`) |"
        )
    refs = r["agreement_references"]
    lines += [
        "",
        f"Agreement: identical output lines (of {r['sentences']}) between each cell's first "
        "pass and this engine's greedy outputs at batch 1, float32 (`"
        + refs.get("float32", "-")
        + "`) and, for int8 cells, int8 (`"
        + refs.get("int8", "-")
        + "`); the first lines that differ, by 0-based index (all of them in the JSON):",
        "",
        "| cell | = float32 | differ | = int8 | differ |",
        "| --- | ---: | --- | ---: | --- |",
    ]

    def differ(a):
        if not a:
            return "", ""
        listed = ", ".join(map(str, a["differ"][:8])) + (" ..." if len(a["differ"]) > 8 else "")
        return str(a["agree"]), listed

    for cid, by_ref in r["agreement"].items():
        f, fl = differ(by_ref.get("float32"))
        i, il = differ(by_ref.get("int8"))
        lines.append(f"| `{cid}` | {f} | {fl} | {i} | {il} |")
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        "source scripts/env.sh",
        "python3 -m pip install -r bench/ctranslate2/requirements.txt",
        "cargo build --release -p nmt-server -p nmt-bench -p model-export",
        r["command"],
        "```",
        "",
        "The converted model, the int8 package, every worker's log and every cell's first-pass "
        "outputs stay in `--work` (default `/tmp/nmt-ct2-bench`). `--render JSON` rewrites "
        "this page from a run's JSON.",
        "",
    ]
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "ct2-worker":
        return ct2_worker(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--render":
        with open(sys.argv[2], encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return 0
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--package", required=True, help="float32 model package CTranslate2 can express")
    p.add_argument("--int8-package", help="its int8 twin (default: `nmt-export quantize` of --package, when it exists)")
    p.add_argument("--no-int8", action="store_true", help="no int8 package on this side")
    p.add_argument("--reference-package", help="also run this engine on this package (e.g. the shipped model), for reference")
    p.add_argument("--reference-modes", default="one,batch", help="modes of the --reference-package cells (one, batch)")
    p.add_argument("--verses", default="data/corpus/test.en")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--warmup", type=int, default=16, help="verses each worker translates before its first pass")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (HTTP) / threads (CTranslate2)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--ct2-threads", default="1,2", help="CTranslate2 intra_threads to measure")
    p.add_argument("--no-ct2-inter2", dest="ct2_inter2", action="store_false",
                   help="skip CTranslate2 with inter_threads 2 x intra_threads 1 (concurrent mode)")
    p.add_argument("--our-threads", default="1,2", help="ONNX Runtime intra-op threads of the engine's batched cells")
    p.add_argument("--our-threads-one", default="1,2",
                   help="ONNX Runtime intra-op threads of the engine's batch-1 cells (ONNX Runtime's "
                   "pool spins while waiting, which a machine shared with other work punishes hard "
                   "at batch 1: measure on an idle machine)")
    p.add_argument("--ct2-omp-wait-policy", default="PASSIVE",
                   help="OMP_WAIT_POLICY of the CTranslate2 workers ('' leaves libgomp's default, "
                   "which spins and on a machine shared with other work made intra_threads 2 up to "
                   "ten times slower than intra_threads 1)")
    p.add_argument("--server-threads", default="1,2", help="nmt-server --intra-op-threads of the HTTP cells (one worker)")
    p.add_argument("--server-workers", default="2",
                   help="nmt-server --model-workers of extra 64-client cells, each worker with one intra-op thread")
    p.add_argument("--only", help="comma-separated substrings: run only cells whose id has one")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between passes, so that spinning pool threads of the previous cell go idle")
    p.add_argument("--work", default="/tmp/nmt-ct2-bench", help="converted models, outputs, logs")
    p.add_argument("--worker-bin", default="target/release/nmt-bench-worker")
    p.add_argument("--server-bin", default="target/release/nmt-server")
    p.add_argument("--export-bin", default="target/release/nmt-export")
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    args = p.parse_args()
    # Paths are taken from where the script is started; the workers run from the workspace
    # root, where the binaries' default paths point.
    for name in ("package", "int8_package", "reference_package", "verses", "work", "out_json", "out_md"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    os.chdir(ROOT)
    args.ct2_threads = [int(x) for x in args.ct2_threads.split(",") if x]
    args.our_threads = [int(x) for x in args.our_threads.split(",") if x]
    args.our_threads_one = [int(x) for x in args.our_threads_one.split(",") if x]
    args.server_threads = [int(x) for x in args.server_threads.split(",") if x]
    args.server_workers = [int(x) for x in args.server_workers.split(",") if x]
    args.reference_modes = [m for m in args.reference_modes.split(",") if m]
    if not set(args.reference_modes) <= {"one", "batch"}:
        p.error("--reference-modes takes one and batch")
    started = time.time()
    os.makedirs(os.path.join(args.work, "logs"), exist_ok=True)
    os.makedirs(os.path.join(args.work, "outputs"), exist_ok=True)
    if not os.environ.get("ORT_DYLIB_PATH"):
        print("compare.py: ORT_DYLIB_PATH is not set (`source scripts/env.sh`)", file=sys.stderr)
        return 2
    for b in (args.worker_bin, args.server_bin):
        if not os.path.exists(b):
            print(f"compare.py: {b} is missing (cargo build --release -p nmt-server -p nmt-bench)", file=sys.stderr)
            return 2

    sys.path.insert(0, HERE)
    import convert

    ct2_model = os.path.join(args.work, "ct2-model")
    try:
        manifest = convert.convert(args.package, ct2_model, force=True)
    except convert.Refused as e:
        print(f"compare.py: CTranslate2 cannot run {args.package}: {e}", file=sys.stderr)
        return 2
    log(f"converted {args.package} -> {ct2_model}")
    int8, int8_how = int8_package(args)
    log(f"int8 package: {int8 or 'none'} ({int8_how})")
    packages = {"float32": args.package}
    if int8:
        packages["int8"] = int8

    cells = cells_for(args, packages)
    if args.only:
        keys = args.only.split(",")
        cells = [c for c in cells if any(k in c["id"] for k in keys)]
    # The Python tokenizer's batch methods would fan out over every core; the cells set their
    # own threads.
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    ct2_env = dict(env)
    if args.ct2_omp_wait_policy:
        ct2_env["OMP_WAIT_POLICY"] = args.ct2_omp_wait_policy
    loadavg_start = open("/proc/loadavg").read().split()[:3]
    busy_start = busy_processes()
    workers = {}

    def stop_all(*_):
        for w in workers.values():
            w.stop()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for c in cells:
            try:
                workers[c["id"]] = Worker(
                    c,
                    worker_command(c, args, ct2_model),
                    os.path.join(args.work, "logs", f"{c['id']}.log"),
                    ct2_env if c["system"] == "CTranslate2" else env,
                )
                log(f"ready: {c['id']}")
            except RuntimeError as e:
                c["failure"] = str(e).splitlines()[0]
                log(f"failed to start: {e}")
        passes = {c["id"]: [] for c in cells}
        for r in range(args.passes):
            order = cells if r % 2 == 0 else list(reversed(cells))
            for c in order:
                w = workers.get(c["id"])
                if w is None or "failure" in c:
                    continue
                time.sleep(args.pause)
                outputs = os.path.join(args.work, "outputs", f"{c['id']}.txt") if r == 0 else None
                try:
                    result = w.run(outputs)
                except (RuntimeError, OSError, ValueError) as e:
                    c["failure"] = f"round {r + 1}: {str(e).splitlines()[0]}"
                    log(f"{c['id']} failed: {e}")
                    continue
                if result.get("errors"):
                    c["failure"] = f"round {r + 1}: {result['errors']} errors, first: {result.get('error')}"
                    log(f"{c['id']}: {c['failure']}")
                    continue
                passes[c["id"]].append(result)
                log(
                    f"round {r + 1}/{args.passes} {c['id']}: {result['output_tokens']} tokens in "
                    f"{result['seconds']:.2f} s = {result['output_tokens'] / result['seconds']:.0f} tok/s"
                )
    finally:
        stop_all()
    for c in cells:
        if passes.get(c["id"]) and "failure" not in c:
            c["result"] = summary(passes[c["id"]])
        c["command"] = shlex.join(worker_command(c, args, ct2_model))
        if c["id"] in workers:
            c["worker"] = workers[c["id"]].ready

    # The conversion's check: every cell's outputs against this engine's greedy outputs at
    # batch 1 (float32), and the int8 cells also against this engine's int8 outputs.
    t = args.our_threads[0] if args.our_threads else None
    references = {p: f"engine-{p}-one-t{t}" for p in ("float32", "int8") if t is not None}
    agree = {}
    for precision, reference_id in references.items():
        ref_path = os.path.join(args.work, "outputs", f"{reference_id}.txt")
        if not os.path.exists(ref_path):
            continue
        reference = read_lines(ref_path)
        for c in cells:
            path = os.path.join(args.work, "outputs", f"{c['id']}.txt")
            if c["id"] == reference_id or c.get("reference") or not os.path.exists(path):
                continue
            if precision == "int8" and c["precision"] != "int8":
                continue
            agree.setdefault(c["id"], {})[precision] = agreement(reference, read_lines(path))

    import ctranslate2
    import onnxruntime
    import tokenizers

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": shlex.join(["python3", os.path.relpath(os.path.abspath(__file__), ROOT)] + sys.argv[1:]),
        "git": git_state(),
        "machine": {
            "cpu": cpu_model(),
            "nproc": os.cpu_count(),
            "loadavg_start": " ".join(loadavg_start),
            "loadavg_end": " ".join(open("/proc/loadavg").read().split()[:3]),
            "busy_start": busy_start,
        },
        "ct2_backend": ct2_backend(ct2_model),
        "versions": {
            "ctranslate2": ctranslate2.__version__,
            "onnxruntime": onnxruntime.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "package": {"path": shown(args.package), "name": manifest["name"], "preset": manifest["config"]["preset"]},
        "int8": {"package": int8 and shown(int8), "how": int8_how},
        "reference_package": args.reference_package and shown(args.reference_package),
        "verses": shown(args.verses),
        "sentences": len(read_verses(args.verses)),
        "passes": args.passes,
        "warmup": args.warmup,
        "clients": args.clients,
        "batch_size": args.batch_size,
        "limits": {k: limit(k) for k in LIMIT_DEFAULTS},
        "ct2_omp_wait_policy": args.ct2_omp_wait_policy or None,
        "cells": cells,
        "agreement_references": references,
        "agreement": agree,
        "wall_seconds": time.time() - started,
    }
    report["ratios"] = ratios(report)
    text = markdown(report)
    print(text)
    if args.out_md:
        with open(args.out_md, "w", encoding="utf-8") as f:
            f.write(text)
    if args.out_json:
        with open(args.out_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 1 if any("failure" in c for c in cells) else 0


def shown(path):
    """A path as the report shows it: relative to the workspace root when inside it."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
