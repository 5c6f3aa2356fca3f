"""CTranslate2's side of nmt_tools.ct2.compare: one cell's worker process. Loads the converted
model, warms up, prints `{"ready": true, ...}`, then answers each `run [PATH]` line on stdin
with one JSON line about a timed pass over every verse (the protocol of nmt-bench-worker, this
side's worker). Started by compare, not meant to be run by hand.

It decodes as this server does: the package's tokenizer, the source with EOS appended (the
converted model's add_source_eos), greedy search, and the server's input limit and output
budget, which compare reads from `nmt-server --help` and passes on as flags.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import resource
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from nmt_tools import verses
from nmt_tools.provenance import version

MODES = ("one", "concurrent", "batch")


class Outcome(NamedTuple):
    """One text's translation, its length in subwords, whether it hit its output budget, and
    whether the input limit refused it."""

    text: str
    tokens: int
    hit_budget: bool
    refused: bool


REFUSED = Outcome("", 0, False, True)


class Ct2Side:
    """A CTranslate2 translator that decodes as this server does."""

    def __init__(self, args: argparse.Namespace) -> None:
        import ctranslate2
        import tokenizers

        package = Path(args.package)
        manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
        self.tokenizer = tokenizers.Tokenizer.from_file(str(package / "tokenizer.json"))
        # An imported Marian model reads and writes with different SentencePiece models.
        target = manifest.get("target_tokenizer")
        self.target_tokenizer = tokenizers.Tokenizer.from_file(str(package / target)) if target else self.tokenizer
        self.ids = self.target_tokenizer.get_vocab(with_added_tokens=True)
        self.translator = ctranslate2.Translator(
            args.model,
            device="cpu",
            compute_type=args.compute_type,
            inter_threads=args.inter_threads,
            intra_threads=args.intra_threads,
        )
        source_limit = manifest["limits"].get("max_source_tokens")
        # As `nmt_engine::limits::model_input_limit`: the model's bound counts the EOS.
        self.input_limit: int = args.max_input_tokens
        if source_limit is not None:
            self.input_limit = min(self.input_limit, source_limit - 1)
        self.max_output: int = min(args.max_output_tokens, manifest["limits"]["max_target_tokens"])
        self.ratio: float = args.max_length_ratio
        self.offset: int = args.max_length_offset

    def budget(self, n: int) -> int:
        """`RequestLimits::output_budget`: ceil(ratio * n) + offset within 1..=max_output."""
        return min(max(math.ceil(self.ratio * n) + self.offset, 1), self.max_output)

    def tokenize(self, text: str) -> list[str] | None:
        """The text's subwords, or None where the server would refuse it."""
        tokens: list[str] = self.tokenizer.encode(text, add_special_tokens=False).tokens
        admitted = bool(text.strip()) and len(tokens) <= self.input_limit
        return tokens if admitted else None

    def detokenize(self, tokens: list[str]) -> str:
        text: str = self.target_tokenizer.decode([self.ids[t] for t in tokens], skip_special_tokens=True)
        return text

    def decode(self, batch: list[list[str]], max_length: int) -> list[list[str]]:
        results = self.translator.translate_batch(
            batch,
            beam_size=1,
            max_decoding_length=max_length,
            min_decoding_length=0,
            max_input_length=0,
            return_scores=False,
        )
        return [list(r.hypotheses[0]) for r in results]

    def one(self, text: str) -> Outcome:
        tokens = self.tokenize(text)
        if tokens is None:
            return REFUSED
        budget = self.budget(len(tokens))
        out = self.decode([tokens], budget)[0]
        return Outcome(self.detokenize(out), len(out), len(out) >= budget, False)

    def pass_one_by_one(self, texts: list[str]) -> list[Outcome]:
        return [self.one(t) for t in texts]

    def pass_concurrent(
        self, texts: list[str], clients: int, pool: concurrent.futures.ThreadPoolExecutor
    ) -> list[Outcome]:
        """`clients` threads, each taking the next text as soon as its previous one is done
        (what closed-loop clients do to a server); translate_batch releases the GIL."""
        results: list[Outcome] = [REFUSED] * len(texts)
        counter: Iterator[int] = iter(range(len(texts)))
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                results[i] = self.one(texts[i])

        for f in [pool.submit(client) for _ in range(min(clients, len(texts)))]:
            f.result()
        return results

    def pass_batched(
        self, texts: list[str], batch_size: int, pool: concurrent.futures.ThreadPoolExecutor | None
    ) -> list[Outcome]:
        """Batches of `batch_size` sorted longest first, the order and batches this engine's
        `translate` makes. One decoding length serves a batch, so each batch runs to its
        longest budget and outputs are cut to their own budget (what this engine stops at).
        With a pool (one thread per `inter_threads` replica), the batches are handed out as
        threads free up, so every replica decodes one: CTranslate2's batching on all cores."""
        results: list[Outcome] = [REFUSED] * len(texts)
        pending: list[tuple[int, list[str]]] = []
        for i, text in enumerate(texts):
            tokens = self.tokenize(text)
            if tokens is not None:
                pending.append((i, tokens))
        pending.sort(key=lambda p: (-len(p[1]), p[0]))
        chunks = [pending[k : k + batch_size] for k in range(0, len(pending), batch_size)]

        def one_batch(chunk: list[tuple[int, list[str]]]) -> None:
            budgets = [self.budget(len(tokens)) for _, tokens in chunk]
            outs = self.decode([tokens for _, tokens in chunk], max(budgets))
            for (i, _), out, budget in zip(chunk, outs, budgets, strict=True):
                kept = out[:budget]
                results[i] = Outcome(self.detokenize(kept), len(kept), len(kept) >= budget, False)

        if pool is None:
            for chunk in chunks:
                one_batch(chunk)
        else:
            for done in [pool.submit(one_batch, chunk) for chunk in chunks]:
                done.result()
        return results


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def write_lines(path: str, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(t.replace("\n", " ").replace("\r", " ") + "\n")


def peak_rss_mib() -> float:
    """This process's peak resident memory since it was started, in MiB: `VmHWM`, as
    nmt-bench-worker reads it for this side. Not `ru_maxrss`, which Linux carries across `exec`
    from the forked parent: a worker started by compare right after it converted the model
    reported the converter's 618 MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    # Elsewhere, ru_maxrss (KiB on Linux, bytes on macOS; the fallback is rough).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pass_answer(results: list[Outcome], seconds: float) -> dict[str, Any]:
    """What a pass reports, as nmt-bench-worker reports it; the peak resident memory is this
    whole process's, the Python interpreter and tokenizer included."""
    refused = sum(r.refused for r in results)
    answer: dict[str, Any] = {
        "sentences": len(results),
        "output_tokens": sum(r.tokens for r in results),
        "seconds": seconds,
        "errors": refused,
        "hit_budget": sum(r.hit_budget for r in results),
        "peak_rss_mib": peak_rss_mib(),
    }
    if refused:
        answer["error"] = f"{refused} inputs refused"
    return answer


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m nmt_tools.ct2.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the converted CTranslate2 model")
    p.add_argument("--package", required=True, help="the model package it was converted from")
    p.add_argument("--verses", required=True)
    p.add_argument("--compute-type", required=True)
    p.add_argument("--intra-threads", type=int, required=True)
    p.add_argument("--inter-threads", type=int, default=1)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=16)
    limits = p.add_argument_group("nmt-server's decoding limits (compare reads them from `nmt-server --help`)")
    limits.add_argument("--max-length-ratio", type=float, required=True)
    limits.add_argument("--max-length-offset", type=int, required=True)
    limits.add_argument("--max-input-tokens", type=int, required=True)
    limits.add_argument("--max-output-tokens", type=int, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    side = Ct2Side(args)
    texts = verses.load(args.verses)
    pool = None
    if args.mode == "concurrent":
        pool = concurrent.futures.ThreadPoolExecutor(args.clients)
    elif args.mode == "batch" and args.inter_threads > 1:
        pool = concurrent.futures.ThreadPoolExecutor(args.inter_threads)

    def run(batch: list[str]) -> list[Outcome]:
        if args.mode == "concurrent" and pool is not None:
            return side.pass_concurrent(batch, args.clients, pool)
        if args.mode == "one":
            return side.pass_one_by_one(batch)
        return side.pass_batched(batch, args.batch_size, pool)

    run(texts[: args.warmup])
    say({"ready": True, "ctranslate2": version("ctranslate2"), "sentences": len(texts)})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] != "run":
            raise SystemExit(f"ct2 worker: unknown command {words[0]!r}")
        start = time.perf_counter()
        results = run(texts)
        seconds = time.perf_counter() - start
        if len(words) > 1:
            write_lines(words[1], [r.text for r in results])
        say(pass_answer(results, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
