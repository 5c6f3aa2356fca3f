"""Are numbers, URLs, e-mail addresses and dates preserved? Sends the probe sentences
(`eval/probes/numbers-urls-dates.txt`, one a line) to a running server and checks that every
such span of each source comes out verbatim in its translation.

    python3 -m nmt_tools.eval.probes --server http://127.0.0.1:8080

The spans are found here by their own regular expressions, not by the server's masking code
(`model_package::placeholders`), so the check does not grade the masking with itself. Prints
each sentence with what it lost, and the share of spans and of sentences preserved; `--json`
writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from nmt_tools.paths import repo_root
from nmt_tools.server import translate

MODULE = "nmt_tools.eval.probes"
URL = r"(?:https?://|www\.)[^\s]+?(?=[.,;:!?)]*(?:\s|$))"
EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
NUMBER = r"(?<![\w])[-+]?\d+(?:[.,:/-]\d+)*(?![\w])"
SPAN = re.compile(f"{URL}|{EMAIL}|{NUMBER}")


def spans(text: str) -> list[str]:
    return [m.group(0) for m in SPAN.finditer(text)]


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


def check(sources: list[str], translations: list[str]) -> dict[str, Any]:
    """Each sentence with the spans it lost, and the counts."""
    rows = [{"source": s, "translation": t, "lost": lost(s, t)} for s, t in zip(sources, translations, strict=True)]
    total = sum(len(spans(s)) for s in sources)
    lost_spans = sum(len(r["lost"]) for r in rows)
    return {
        "spans": total,
        "spans_preserved": total - lost_spans,
        "sentences": len(rows),
        "sentences_preserved": sum(not r["lost"] for r in rows),
        "rows": rows,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--server", default="http://127.0.0.1:8080", help="base URL of a running nmt-server")
    p.add_argument(
        "--probes",
        type=Path,
        help="one sentence a line (default: eval/probes/numbers-urls-dates.txt of the repository)",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    probes = args.probes or repo_root() / "eval" / "probes" / "numbers-urls-dates.txt"
    sources = [line for line in probes.read_text().splitlines() if line.strip()]
    summary = check(sources, translate(args.server, sources))
    for r in summary["rows"]:
        print(
            f"{'ok  ' if not r['lost'] else 'LOST'} {r['source']}\n     {r['translation']}"
            + (f"\n     lost: {r['lost']}" if r["lost"] else "")
        )
    print(
        f"spans preserved: {summary['spans_preserved']}/{summary['spans']}; "
        f"sentences with every span: {summary['sentences_preserved']}/{summary['sentences']}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
