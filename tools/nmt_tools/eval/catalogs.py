#!/usr/bin/env python3
"""Translate the held-out gettext catalogs through a running server and check them with
gettext's own `msgfmt --check-format`.

The Spanish catalogs of the held-out packages (role `test` or `dev` in
`train/data/debian-catalogs.tsv`) are taken from the packages' Debian *source* (their `es.po`):
unlike the binary `.mo`, it keeps the flags (`c-format`, `python-format`, ...) that tell msgfmt
which entries to check. Every translated, non-fuzzy entry is sent to the server's
`POST /translate` (msgid, and msgid_plural for the plural form); the catalog is written back with
the machine translations and run through `msgfmt --check-format`. The reference catalog goes
through the same check, as a control.

    python3 -m nmt_tools.eval.catalogs --server http://127.0.0.1:8080 --out runs/catalog-check

Writes `<out>/<package>.mt.po`, `<out>/<package>.msgfmt.txt`, and `<out>/report.json` (entries,
format-flagged entries, entries msgfmt rejects, share passing; placeholders preserved). Needs
gettext (msgfmt), Debian's package mirror, and polib (`pip install -e 'tools[catalogs]'`).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_tools.server import translate

if TYPE_CHECKING:
    import polib

MODULE = "nmt_tools.eval.catalogs"

MIRRORS = ("http://deb.debian.org/debian", "http://deb.debian.org/debian-security")
POOL_DIRS = ("pool/main", "pool/updates/main")
BATCH = 32
# What msgfmt prints per problem: "<file>:<line>: <message>".
MSGFMT_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): ")


@dataclass
class CatalogReport:
    package: str
    source: str
    version: str
    po_file: str
    entries: int
    format_entries: int
    rejected_mt: int
    rejected_reference: int
    passing_share: float
    placeholders_kept_share: float


def deb_field(deb: Path, field: str) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cached_deb(cache: Path, package: str) -> Path:
    debs = sorted(cache.glob(f"{package}_*.deb"))
    if not debs:
        raise SystemExit(f"{package}: no .deb in {cache} (run `nmt-train corpus --catalogs ...` first)")
    return debs[-1]


def source_of(deb: Path) -> tuple[str, str]:
    """The source package and its version (a binary rebuild's `+bN` dropped)."""
    source = deb_field(deb, "Source") or deb_field(deb, "Package")
    version = deb_field(deb, "Version")
    match = re.match(r"(\S+)\s*\((\S+)\)", source)
    if match:
        source, version = match.group(1), match.group(2)
    return source, re.sub(r"\+b\d+$", "", version)


def pool_prefix(source: str) -> str:
    return source[:4] if source.startswith("lib") else source[0]


def fetch(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return bytes(response.read())
    except OSError:
        return None


def download_source(source: str, version: str, into: Path) -> list[Path]:
    """The tarballs of `source` at `version` (from its .dsc), downloaded into `into`."""
    plain = version.split(":", 1)[-1]
    for mirror in MIRRORS:
        for pool in POOL_DIRS:
            base = f"{mirror}/{pool}/{pool_prefix(source)}/{source}"
            dsc = fetch(f"{base}/{source}_{plain}.dsc")
            if dsc is None:
                continue
            names = re.findall(r"^ [0-9a-f]{64} \d+ (\S+\.tar\.\w+)$", dsc.decode(), re.MULTILINE)
            # A security update's .dsc sits in the security pool, its unchanged .orig in the
            # main one: look for each file in every pool.
            bases = [base] + [f"{m}/{p}/{pool_prefix(source)}/{source}" for m in MIRRORS for p in POOL_DIRS]
            paths = []
            for name in names:
                data = next((d for b in bases if (d := fetch(f"{b}/{name}")) is not None), None)
                if data is None:
                    raise SystemExit(f"{name}: not in any pool")
                path = into / name
                path.write_bytes(data)
                paths.append(path)
            return paths
    raise SystemExit(f"{source} {version}: no .dsc on {', '.join(MIRRORS)}")


def extract_es_po(tarballs: list[Path], into: Path) -> Path:
    """The Spanish catalog of the sources: the `es.po` closest to the top of the tree."""
    found: list[tuple[int, str, Path]] = []
    for tarball in tarballs:
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith("/es.po")]
            for member in members:
                tar.extract(member, into, filter="data")
                found.append((member.name.count("/"), member.name, into / member.name))
    if not found:
        raise SystemExit(f"no es.po in {', '.join(map(str, tarballs))}")
    return min(found)[2]


def checked_entries(po: polib.POFile) -> list[polib.POEntry]:
    """The entries a catalog ships: translated, not fuzzy, not obsolete, not the header."""
    return [e for e in po if e.msgid and e.translated() and not e.obsolete and "fuzzy" not in e.flags]


def is_format_entry(entry: polib.POEntry) -> bool:
    return any(f.endswith("-format") and not f.startswith("no-") for f in entry.flags)


def machine_translated(po: polib.POFile, entries: list[polib.POEntry], server: str) -> None:
    """Replaces the msgstr of `entries` with the server's translations."""
    texts: list[str] = []
    for e in entries:
        texts.append(e.msgid)
        if e.msgid_plural:
            texts.append(e.msgid_plural)
    translations = iter(translate(server, texts, batch_size=BATCH))
    for e in entries:
        if e.msgid_plural:
            singular, plural = next(translations), next(translations)
            forms = sorted(e.msgstr_plural) or [0, 1]
            e.msgstr_plural = {k: singular if k == 0 else plural for k in forms}
        else:
            e.msgstr = next(translations)
    po.metadata["Content-Type"] = "text/plain; charset=UTF-8"


def rejected_lines(po_path: Path, log: Path) -> set[int]:
    """Lines msgfmt --check-format complains about (each names the entry's msgid line or one
    of its msgstr lines)."""
    result = subprocess.run(
        ["msgfmt", "--check-format", "-o", "/dev/null", str(po_path)], capture_output=True, text=True, check=False
    )
    log.write_text(result.stderr)
    lines = set()
    for line in result.stderr.splitlines():
        match = MSGFMT_LINE.match(line)
        if match and match.group("file").endswith(po_path.name):
            lines.add(int(match.group("line")))
    return lines


def entries_hit(po_path: Path, lines: set[int]) -> int:
    """How many entries of the written catalog `lines` fall in (an entry spans from its
    first line to the next entry's)."""
    import polib

    starts = sorted(e.linenum for e in polib.pofile(str(po_path)) if e.msgid and e.linenum is not None)
    hit = set()
    for line in lines:
        before = [s for s in starts if s <= line]
        if before:
            hit.add(before[-1])
    return len(hit)


def placeholders_kept(reference: list[polib.POEntry], translated: list[polib.POEntry]) -> float:
    """Share of entries whose printf/brace placeholders all come out in the translation."""
    token = re.compile(r"%(?:\d+\$)?[-+#0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?[a-zA-Z%]|\{[^{}\s]*\}")
    with_any = [(r, t) for r, t in zip(reference, translated, strict=False) if token.search(r.msgid)]
    if not with_any:
        return 1.0
    kept = sum(
        sorted(token.findall(r.msgid)) == sorted(token.findall(t.msgstr or "")) or bool(r.msgid_plural)
        for r, t in with_any
    )
    return kept / len(with_any)


def check_package(package: str, cache: Path, server: str, out: Path, limit: int | None) -> CatalogReport:
    import polib

    source, version = source_of(cached_deb(cache, package))
    with tempfile.TemporaryDirectory() as tmp:
        po_path = extract_es_po(download_source(source, version, Path(tmp)), Path(tmp) / "src")
        reference_po = polib.pofile(str(po_path), wrapwidth=0)
        po_name = str(po_path.relative_to(Path(tmp) / "src"))
    reference_path = out / f"{package}.reference.po"
    reference_po.save(str(reference_path))
    reference_entries = checked_entries(reference_po)
    mt_po = polib.pofile(str(reference_path), wrapwidth=0)
    mt_po[:] = [e for e in mt_po if not e.obsolete]
    entries = checked_entries(mt_po)[:limit]
    mt_po[:] = [e for e in mt_po if e in entries or not e.msgid]
    machine_translated(mt_po, entries, server)
    mt_path = out / f"{package}.mt.po"
    mt_po.save(str(mt_path))
    rejected = entries_hit(mt_path, rejected_lines(mt_path, out / f"{package}.msgfmt.txt"))
    rejected_ref = entries_hit(reference_path, rejected_lines(reference_path, out / f"{package}.reference.msgfmt.txt"))
    return CatalogReport(
        package=package,
        source=source,
        version=version,
        po_file=po_name,
        entries=len(entries),
        format_entries=sum(map(is_format_entry, entries)),
        rejected_mt=rejected,
        rejected_reference=rejected_ref,
        passing_share=round(1 - rejected / max(1, len(entries)), 4),
        placeholders_kept_share=round(placeholders_kept(reference_entries[: len(entries)], entries), 4),
    )


def held_out_packages(pins: Path) -> list[str]:
    rows = [line.split("\t") for line in pins.read_text().splitlines() if line and not line.startswith("#")]
    return [r[0] for r in rows[1:] if r[2] in ("test", "dev")]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--server", default="http://127.0.0.1:8080", help="base URL of a running nmt-server")
    p.add_argument("--packages", nargs="*", help="packages to check (default: the held-out ones of --pins)")
    p.add_argument("--pins", type=Path, default=Path("train/data/debian-catalogs.tsv"), help="the pinned package list")
    p.add_argument(
        "--cache", type=Path, default=Path("data/debian-cache"), help="where nmt-train corpus downloaded the .debs"
    )
    p.add_argument("--out", type=Path, default=Path("runs/catalog-check"), help="output directory")
    p.add_argument("--limit", type=int, help="only the first N entries of each catalog (quick runs)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for package in args.packages or held_out_packages(args.pins):
        report = check_package(package, args.cache, args.server, args.out, args.limit)
        print(json.dumps(asdict(report)))
        reports.append(report)
    total = sum(r.entries for r in reports)
    rejected = sum(r.rejected_mt for r in reports)
    summary = {
        "catalogs": [asdict(r) for r in reports],
        "entries": total,
        "rejected": rejected,
        "passing_share": round(1 - rejected / max(1, total), 4),
    }
    (args.out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"msgfmt --check-format: {total - rejected}/{total} entries pass ({summary['passing_share']:.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
