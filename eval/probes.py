#!/usr/bin/env python3
"""Are numbers, URLs, e-mail addresses and dates preserved? Sends the probe sentences
(`eval/probes/numbers-urls-dates.txt`, one a line) to a running server and checks that every
such span of each source comes out verbatim in its translation.

    python3 eval/probes.py --server http://127.0.0.1:8080

The spans are found here by their own regular expressions, not by the server's masking code
(`model_package::placeholders`), so the check does not grade the masking with itself. Prints
each sentence with what it lost, and the share of spans and of sentences preserved; `--json`
writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.request
from pathlib import Path

URL = r"(?:https?://|www\.)[^\s]+?(?=[.,;:!?)]*(?:\s|$))"
EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
NUMBER = r"(?<![\w])[-+]?\d+(?:[.,:/-]\d+)*(?![\w])"
SPAN = re.compile(f"{URL}|{EMAIL}|{NUMBER}")


def spans(text: str) -> list[str]:
    return [m.group(0) for m in SPAN.finditer(text)]


def translate(server: str, texts: list[str]) -> list[str]:
    body = json.dumps({"text": texts}).encode()
    request = urllib.request.Request(f"{server}/translate", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return [t["text"] for t in json.load(response)["translations"]]


def lost(source: str, translation: str) -> list[str]:
    """The spans of `source` missing from `translation` (each occurrence counted)."""
    rest = translation
    missing = []
    for span in spans(source):
        # Whole, not inside a longer number or word: "250" is not kept by "25000491234".
        found = re.search(rf"(?<![\w.,:/-]){re.escape(span)}(?![\w]|[.,:/-]\w)", rest)
        if found:
            rest = rest[: found.start()] + " " + rest[found.end() :]
        else:
            missing.append(span)
    return missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="http://127.0.0.1:8080", help="base URL of a running nmt-server")
    parser.add_argument(
        "--probes",
        type=Path,
        default=Path(__file__).parent / "probes" / "numbers-urls-dates.txt",
        help="one sentence a line",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    sources = [line for line in args.probes.read_text().splitlines() if line.strip()]
    translations = translate(args.server, sources)
    total = sum(len(spans(s)) for s in sources)
    rows = [{"source": s, "translation": t, "lost": lost(s, t)} for s, t in zip(sources, translations)]
    lost_spans = sum(len(r["lost"]) for r in rows)
    whole = sum(not r["lost"] for r in rows)
    for r in rows:
        print(
            f"{'ok  ' if not r['lost'] else 'LOST'} {r['source']}\n     {r['translation']}"
            + (f"\n     lost: {r['lost']}" if r["lost"] else "")
        )
    summary = {
        "spans": total,
        "spans_preserved": total - lost_spans,
        "sentences": len(rows),
        "sentences_preserved": whole,
        "rows": rows,
    }
    print(f"spans preserved: {total - lost_spans}/{total}; sentences with every span: {whole}/{len(rows)}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
