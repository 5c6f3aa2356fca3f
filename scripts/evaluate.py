#!/usr/bin/env python3
"""Scores a model package on a corpus split through the real server, with sacrebleu.

Starts target/release/nmt-server on a free loopback port, sends the split's source lines in
batches to POST /translate, writes the hypotheses next to the report, and prints (and writes)
BLEU, chrF and TER as sacrebleu computes them, plus timing, plus BLEU and the output/reference
length ratio by source length (in subwords, as the server counted them).

    python3 scripts/evaluate.py --package models/en-es-transformer --corpus data/corpus --split dev
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import sacrebleu

# Source-length buckets in subwords, as in the corpus statistics.
BUCKETS = [(1, 10), (11, 20), (21, 30), (31, 40), (41, 60), (61, 80), (81, 10**9)]


def post(url, payload):
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def wait_until_ready(url, timeout=120):
    """/ready answers 503 until the server's warm-up translation is done."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/ready") as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as error:
            if error.code != 503:
                raise
        if time.time() > deadline:
            sys.exit(f"nmt-server not ready within {timeout} s")
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="models/en-es-transformer", help="model package directory")
    parser.add_argument("--corpus", default="data/corpus", help="corpus directory (nmt-train corpus)")
    parser.add_argument("--split", default="dev", help="split to score: dev or test")
    parser.add_argument("--batch", type=int, default=16, help="texts per request")
    parser.add_argument("--server", default="target/release/nmt-server", help="nmt-server binary")
    parser.add_argument("--out", help="report path (default: <package>/../eval-<split>.json)")
    args = parser.parse_args()

    with open(os.path.join(args.corpus, f"{args.split}.en"), encoding="utf-8") as f:
        sources = [line.rstrip("\n") for line in f]
    with open(os.path.join(args.corpus, f"{args.split}.es"), encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]

    server = subprocess.Popen(
        [args.server, "--model-dir", args.package, "--port", "0", "--grpc-port", "0",
         "--max-input-tokens", "100000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        for line in server.stdout:
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        if url is None:
            sys.exit("nmt-server exited before listening")
        wait_until_ready(url)
        hypotheses, lengths, refused = [], [], 0
        started = time.time()
        for i in range(0, len(sources), args.batch):
            batch = sources[i : i + args.batch]
            try:
                translations = post(f"{url}/translate", {"text": batch})["translations"]
                hypotheses += [t["text"] for t in translations]
                lengths += [t["source_tokens"] for t in translations]
            except urllib.error.HTTPError as error:
                # A batch with a source over the model's limit: translate one by one, and
                # score refused sources as empty translations.
                if error.code != 413:
                    raise
                for text in batch:
                    try:
                        translation = post(f"{url}/translate", {"text": text})["translations"][0]
                        hypotheses.append(translation["text"])
                        lengths.append(translation["source_tokens"])
                    except urllib.error.HTTPError as inner:
                        if inner.code != 413:
                            raise
                        hypotheses.append("")
                        lengths.append(None)
                        refused += 1
        seconds = time.time() - started
    finally:
        server.terminate()
        server.wait()

    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.package)), f"eval-{args.split}.json")
    with open(out.replace(".json", ".hyp"), "w", encoding="utf-8") as f:
        f.write("\n".join(hypotheses) + "\n")
    bleu = sacrebleu.BLEU()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    report = {
        "package": args.package,
        "split": args.split,
        "sentences": len(sources),
        "refused_as_too_long": refused,
        "bleu": round(bleu_score.score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "ter": round(sacrebleu.corpus_ter(hypotheses, [references]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "seconds": round(seconds, 1),
        "sentences_per_second": round(len(sources) / seconds, 1),
    }
    report["by_source_length"] = []
    for low, high in BUCKETS:
        rows = [i for i, n in enumerate(lengths) if n is not None and low <= n <= high]
        if not rows:
            continue
        score = sacrebleu.BLEU().corpus_score([hypotheses[i] for i in rows], [[references[i] for i in rows]])
        report["by_source_length"].append(
            {
                "subwords": f"{low}-{high}" if high < 10**9 else f"{low}+",
                "sentences": len(rows),
                "bleu": round(score.score, 2),
                "length_ratio": round(score.sys_len / max(score.ref_len, 1), 3),
            }
        )
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
