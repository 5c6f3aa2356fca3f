"""This server against CTranslate2 on the same weights, side by side, in one run.

    source scripts/env.sh
    cargo build --release -p nmt-server -p nmt-bench -p model-export
    python3 -m pip install -e 'tools[ct2]'
    python3 -m nmt_tools.ct2.compare --package PACKAGE \\
        --out-json docs/benchmarks/ctranslate2.json --out-md docs/benchmarks/ctranslate2.md

The package is converted to a CTranslate2 model (nmt_tools.ct2.convert; a package imported from a
Hugging Face directory by `nmt-export import-marian` is compared on CTranslate2's own conversion
of that directory, `--hf-dir`), and its int8 twin is
written by `nmt-export quantize` when that subcommand exists (or given with --int8-package).
Every configuration measured ("cell") runs in its own worker process, loaded and warmed up
once and kept for the whole run: CTranslate2's in `python3 -m nmt_tools.ct2.worker`, this
server's in `nmt-bench-worker` (its engine in-process, or nmt-server over HTTP with Rust
closed-loop clients, as nmt-bench drives it). The runner is Python because CTranslate2 is used
through its Python API, as its users use it; this side stays in Rust so that it is measured
through its own code, and so that 64 HTTP clients take as little CPU from the server they share
two cores with as nmt-bench's do. CTranslate2 decodes within the server's own input limit and
output budget, read from `--server-bin --help` (and the NMT_* variables it reads), so both
sides stop where the server would. One pass translates every verse once; the throughput is
target subwords (EOS not counted) over the pass's wall time, tokenization and detokenization
included. Passes are interleaved: round 1 runs every cell once in order, round 2 in reverse
order, and so on (ABBA...), so that drift in the machine's speed hits every cell alike. Each
cell reports the median of its passes and their range.

The outputs of each cell's first pass are kept (written after its clock stops) and compared
line by line with this engine's float32 greedy outputs at batch 1: the agreement check of the
conversion.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from nmt_tools import verses
from nmt_tools.ct2 import convert
from nmt_tools.ct2.cells import CT2, Cell, cells_for, worker_command
from nmt_tools.ct2.report import Report, agreement, goal_ratios, markdown, ratios, summary
from nmt_tools.machine import busy_processes, cpu_model, isa_flags, loadavg
from nmt_tools.paths import repo_root, shown
from nmt_tools.provenance import command_line, git_state, utc_now, version
from nmt_tools.server import Limit, server_limits
from nmt_tools.worker import Worker

MODULE = "nmt_tools.ct2.compare"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--render", metavar="JSON", help="print the Markdown page of a run's JSON, and nothing else")
    add("--package", help="float32 model package CTranslate2 can express (required unless --render)")
    add(
        "--hf-dir",
        help="the Hugging Face directory --package was imported from (`nmt-export import-marian`): "
        "CTranslate2 converts it with its own converter (`ct2-transformers-converter`) instead",
    )
    add("--int8-package", help="its int8 twin (default: `nmt-export quantize` of --package, when it exists)")
    add("--no-int8", action="store_true", help="no int8 package on this side")
    add("--reference-package", help="also run this engine on this package (e.g. the shipped model), for reference")
    add("--reference-modes", default="one,batch", help="modes of the --reference-package cells (one, batch)")
    add("--verses", default="data/corpus/test.en", help="English inputs, as nmt-bench reads them")
    add("--passes", type=int, default=3, help="timed passes per cell")
    add("--warmup", type=int, default=16, help="verses each worker translates before its first pass")
    add("--clients", type=int, default=64, help="concurrent clients (HTTP) / threads (CTranslate2)")
    add(
        "--batch-size",
        default="8,16,32",
        help="sentences per batch of the batched cells, comma-separated: each size is a cell of "
        "its own on both sides, so that each engine is compared at its best size (CTranslate2's "
        "int8 was fastest at 16 and its float32 at 32 on a 2-core AMD EPYC; this engine's int8 at 8)",
    )
    add("--ct2-threads", default="1,2", help="CTranslate2 intra_threads to measure")
    add(
        "--no-ct2-inter2",
        dest="ct2_inter2",
        action="store_false",
        help="skip CTranslate2 with inter_threads 2 x intra_threads 1 (concurrent and batch modes)",
    )
    add("--our-threads", default="1,2", help="ONNX Runtime intra-op threads of the engine's batched cells")
    add(
        "--our-threads-one",
        default="1,2",
        help="ONNX Runtime intra-op threads of the engine's batch-1 cells (ONNX Runtime's "
        "pool spins while waiting, which a machine shared with other work punishes hard "
        "at batch 1: measure on an idle machine)",
    )
    add(
        "--ct2-omp-wait-policy",
        default="",
        help="OMP_WAIT_POLICY of the CTranslate2 workers (default '': libgomp's own, which "
        "spins, as CTranslate2's users run it; PASSIVE made its intra_threads 2 about 5x "
        "slower on an idle machine, so it is no fair default)",
    )
    add("--server-threads", default="1,2", help="nmt-server --intra-op-threads of the HTTP cells (one worker)")
    add(
        "--server-workers",
        default="2",
        help="workers of extra cells, each with one intra-op thread: nmt-server --model-workers under 64 "
        "clients, and the engine's --workers on sorted batches (CTranslate2's inter_threads)",
    )
    add("--only", help="comma-separated substrings: run only cells whose id has one")
    add(
        "--pause",
        type=float,
        default=0.5,
        help="seconds between passes, so that spinning pool threads of the previous cell go idle",
    )
    add("--work", default="/tmp/nmt-ct2-bench", help="converted models, outputs, logs")
    add("--worker-bin", default="target/release/nmt-bench-worker")
    add("--server-bin", default="target/release/nmt-server", help="also where the decoding limits are read from")
    add("--export-bin", default="target/release/nmt-export")
    add("--out-json", help="write the numbers here")
    add("--out-md", help="write the page here")
    return p


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.render:
        return args
    if not args.package:
        p.error("--package is required (unless --render)")
    # Paths are taken from where the module is started; the workers run from the repository
    # root, where the binaries' default paths point.
    for name in ("package", "hf_dir", "int8_package", "reference_package", "verses", "work", "out_json", "out_md"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    for name in ("ct2_threads", "our_threads", "our_threads_one", "server_threads", "server_workers", "batch_size"):
        setattr(args, name, numbers(getattr(args, name)))
    args.reference_modes = [m for m in args.reference_modes.split(",") if m]
    if not set(args.reference_modes) <= {"one", "batch"}:
        p.error("--reference-modes takes one and batch")
    return args


def missing_prerequisite(args: argparse.Namespace) -> str | None:
    """What this run cannot start without, if anything is missing."""
    if not os.environ.get("ORT_DYLIB_PATH"):
        return "ORT_DYLIB_PATH is not set (`source scripts/env.sh`)"
    for b in (args.worker_bin, args.server_bin):
        if not os.path.exists(b):
            return f"{b} is missing (cargo build --release -p nmt-server -p nmt-bench)"
    return None


def int8_package(args: argparse.Namespace) -> tuple[str | None, str]:
    """The int8 twin: --int8-package, or `nmt-export quantize` when that subcommand exists."""
    if args.int8_package:
        return args.int8_package, "given with --int8-package"
    if args.no_int8:
        return None, "skipped (--no-int8)"
    help_text = subprocess.run([args.export_bin, "--help"], capture_output=True, text=True, check=False)
    if help_text.returncode != 0 or "quantize" not in help_text.stdout:
        return None, f"`{args.export_bin} quantize` does not exist (yet): no int8 package"
    out = os.path.join(args.work, "package-int8")
    command = [args.export_bin, "quantize", "--package", args.package, "--out", out]
    if os.path.exists(out):
        shutil.rmtree(out)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None, f"`{shlex.join(command)}` failed: {done.stderr.strip()[-500:]}"
    return out, f"`{shlex.join(command)}`"


def ct2_backend(model: Path) -> str:
    """What CTranslate2 picked on this CPU (instruction set, GEMM backends), from its own log."""
    code = "import ctranslate2, sys; ctranslate2.Translator(sys.argv[1], device='cpu', compute_type='int8')"
    done = subprocess.run(
        [sys.executable, "-c", code, str(model)],
        capture_output=True,
        text=True,
        env=dict(os.environ, CT2_VERBOSE="1"),
        check=False,
    )
    wanted = ("Selected ISA", "Use Intel MKL", "SGEMM backend", "GEMM_S8 backend")
    found = [line.split("]")[-1].strip(" -") for line in done.stderr.splitlines() if any(w in line for w in wanted)]
    return "; ".join(found) or "unknown"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Run:
    """One benchmark run: its cells, their workers and what they measured."""

    def __init__(self, args: argparse.Namespace, ct2_model: Path, limits: dict[str, Limit], cells: list[Cell]) -> None:
        self.args = args
        self.ct2_model = ct2_model
        self.limits = limits
        self.cells = cells
        self.workers: dict[str, Worker] = {}
        self.passes: dict[str, list[dict[str, Any]]] = {c["id"]: [] for c in cells}
        self.work = Path(args.work)

    def command(self, cell: Cell) -> list[str]:
        return worker_command(cell, self.args, self.ct2_model, self.limits)

    def start_workers(self, env: dict[str, str], ct2_env: dict[str, str]) -> None:
        for c in self.cells:
            try:
                self.workers[c["id"]] = Worker(
                    c["id"],
                    self.command(c),
                    self.work / "logs" / f"{c['id']}.log",
                    ct2_env if c["system"] == CT2 else env,
                )
                log(f"ready: {c['id']}")
            except RuntimeError as e:
                c["failure"] = str(e).splitlines()[0]
                log(f"failed to start: {e}")

    def sentences(self) -> int:
        """How many texts every worker read; raises if the sides read the inputs differently
        (nmt_tools.verses against bench/src/verses.rs)."""
        counts = {cid: w.ready.get("sentences") for cid, w in self.workers.items()}
        expected = len(verses.load(self.args.verses))
        differ = {cid: n for cid, n in counts.items() if n != expected}
        if differ:
            raise RuntimeError(f"workers read other numbers of inputs than {expected}: {differ}")
        return expected

    def one_pass(self, c: Cell, round_index: int) -> None:
        w = self.workers.get(c["id"])
        if w is None or "failure" in c:
            return
        time.sleep(self.args.pause)
        outputs = self.work / "outputs" / f"{c['id']}.txt" if round_index == 0 else None
        try:
            result = w.run(outputs)
        except (RuntimeError, OSError, ValueError) as e:
            c["failure"] = f"round {round_index + 1}: {str(e).splitlines()[0]}"
            log(f"{c['id']} failed: {e}")
            return
        if result.get("errors"):
            c["failure"] = f"round {round_index + 1}: {result['errors']} errors, first: {result.get('error')}"
            log(f"{c['id']}: {c['failure']}")
            return
        self.passes[c["id"]].append(result)
        log(
            f"round {round_index + 1}/{self.args.passes} {c['id']}: {result['output_tokens']} tokens in "
            f"{result['seconds']:.2f} s = {result['output_tokens'] / result['seconds']:.0f} tok/s"
        )

    def rounds(self) -> None:
        """Every cell once per round, in order, then in reverse order (ABBA...)."""
        for r in range(self.args.passes):
            for c in self.cells if r % 2 == 0 else list(reversed(self.cells)):
                self.one_pass(c, r)

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop()

    def record(self) -> None:
        """Each cell's summary, worker command and ready line, into the cell."""
        for c in self.cells:
            if self.passes.get(c["id"]) and "failure" not in c:
                c["result"] = summary(self.passes[c["id"]])
            c["command"] = shlex.join(self.command(c))
            if c["id"] in self.workers:
                c["worker"] = self.workers[c["id"]].ready

    def agreement(self) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """The conversion's check: every cell's outputs against this engine's greedy outputs at
        batch 1 (float32), and the int8 cells also against this engine's int8 outputs."""
        t = self.args.our_threads[0] if self.args.our_threads else None
        references = {p: f"engine-{p}-one-t{t}" for p in ("float32", "int8") if t is not None}
        agree: dict[str, dict[str, Any]] = {}
        for precision, reference_id in references.items():
            ref_path = self.work / "outputs" / f"{reference_id}.txt"
            # Only a reference this run wrote: `--work` keeps earlier runs' outputs, whose
            # binaries or packages may have been others.
            if not self.passes.get(reference_id) or not ref_path.exists():
                continue
            reference = read_lines(ref_path)
            for c in self.cells:
                path = self.work / "outputs" / f"{c['id']}.txt"
                if c["id"] == reference_id or c.get("reference") or not path.exists():
                    continue
                if precision == "int8" and c["precision"] != "int8":
                    continue
                agree.setdefault(c["id"], {})[precision] = agreement(reference, read_lines(path))
        return references, agree


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def measure(run: Run, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Starts the workers, runs the rounds, stops the workers; the number of inputs and the
    state of the machine meanwhile."""
    # The Python tokenizer's batch methods would fan out over every core; the cells set their
    # own threads.
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    ct2_env = dict(env)
    if args.ct2_omp_wait_policy:
        ct2_env["OMP_WAIT_POLICY"] = args.ct2_omp_wait_policy
    machine: dict[str, Any] = {
        "cpu": cpu_model(),
        "isa": isa_flags(),
        "nproc": os.cpu_count(),
        "loadavg_start": loadavg(),
    }
    machine["busy_start"] = busy_processes()

    def terminated(*_: object) -> NoReturn:
        sys.exit(143)

    signal.signal(signal.SIGTERM, terminated)
    try:
        run.start_workers(env, ct2_env)
        sentences = run.sentences()
        run.rounds()
    finally:
        run.stop()
    machine["loadavg_end"] = loadavg()
    return sentences, machine


def build_report(
    args: argparse.Namespace, run: Run, manifest: dict[str, Any], int8: tuple[str | None, str], started: float
) -> Report:
    sentences, machine = measure(run, args)
    run.record()
    references, agree = run.agreement()
    report: Report = {
        "date": utc_now(),
        "command": command_line(MODULE),
        "git": git_state(),
        "machine": machine,
        "ct2_backend": ct2_backend(run.ct2_model),
        "versions": {name: version(name) for name in ("ctranslate2", "onnxruntime", "tokenizers")},
        "package": {
            "path": shown(args.package),
            "name": manifest["name"],
            "preset": manifest["config"]["preset"],
            "hf_dir": args.hf_dir and shown(args.hf_dir),
        },
        "int8": {"package": int8[0] and shown(int8[0]), "how": int8[1]},
        "reference_package": args.reference_package and shown(args.reference_package),
        "verses": shown(args.verses),
        "sentences": sentences,
        "passes": args.passes,
        "warmup": args.warmup,
        "clients": args.clients,
        "batch_sizes": args.batch_size,
        "limits": {limit.env: limit.value for limit in run.limits.values()},
        "ct2_omp_wait_policy": args.ct2_omp_wait_policy or None,
        "cells": run.cells,
        "agreement_references": references,
        "agreement": agree,
        "wall_seconds": time.time() - started,
    }
    report["ratios"] = ratios(report)
    report["goal_ratios"] = goal_ratios(report)
    return report


def write_outputs(report: Report, args: argparse.Namespace) -> None:
    text = markdown(report)
    print(text)
    if args.out_md:
        Path(args.out_md).write_text(text, encoding="utf-8")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text(encoding="utf-8"))))
        return 0
    os.chdir(repo_root())
    started = time.time()
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "outputs").mkdir(parents=True, exist_ok=True)
    problem = missing_prerequisite(args)
    if problem:
        print(f"compare: {problem}", file=sys.stderr)
        return 2
    ct2_model = work / "ct2-model"
    try:
        if args.hf_dir:
            manifest = convert.convert_hf(args.hf_dir, args.package, ct2_model)
        else:
            manifest = convert.convert(args.package, ct2_model, force=True)
    except convert.Refused as e:
        print(f"compare: CTranslate2 cannot run {args.package}: {e}", file=sys.stderr)
        return 2
    log(f"converted {args.package} -> {ct2_model}")
    int8 = int8_package(args)
    log(f"int8 package: {int8[0] or 'none'} ({int8[1]})")
    packages = {"float32": args.package} | ({"int8": int8[0]} if int8[0] else {})
    cells = cells_for(args, packages)
    if args.only:
        keys = args.only.split(",")
        cells = [c for c in cells if any(k in c["id"] for k in keys)]
    run = Run(args, ct2_model, server_limits(args.server_bin), cells)
    report = build_report(args, run, manifest, int8, started)
    write_outputs(report, args)
    return 1 if any("failure" in c for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
