"""The checks made through a running server, on their pure parts."""

from __future__ import annotations

from pathlib import Path

from nmt_tools.eval import catalogs, evaluate, probes


def test_probe_spans_kept_or_lost() -> None:
    source = "Order 250 ships on 2024-05-01 from https://example.org/a, ask bob@example.com."
    assert probes.spans(source) == ["250", "2024-05-01", "https://example.org/a", "bob@example.com"]
    kept = "El pedido 250 sale el 2024-05-01 de https://example.org/a, pregunte a bob@example.com."
    assert probes.lost(source, kept) == []
    # Inside a longer number is not kept; each occurrence counts.
    assert probes.lost("250 and 250", "25000491234 y 250") == ["250"]
    summary = probes.check([source, "No numbers."], [kept, "Sin números."])
    assert (summary["spans"], summary["spans_preserved"], summary["sentences_preserved"]) == (4, 4, 2)


def test_the_probe_file_is_in_the_repository() -> None:
    default = Path(probes.__file__).resolve().parents[3] / "eval" / "probes" / "numbers-urls-dates.txt"
    assert default.read_text().strip()


def test_held_out_catalogs(tmp_path: Path) -> None:
    pins = tmp_path / "pins.tsv"
    pins.write_text("# pinned\npackage\tversion\trole\ngit\t1\ttest\nvim\t2\ttrain\naudacity\t3\tdev\n")
    assert catalogs.held_out_packages(pins) == ["git", "audacity"]
    assert catalogs.pool_prefix("libreoffice") == "libr"
    assert catalogs.pool_prefix("git") == "g"


def test_evaluate_names_the_shipped_package_when_none_is_given() -> None:
    args = evaluate.nmt_eval_args(["--split", "dev"])
    assert args[0] == "--package" and args[1].endswith("models/en-es-rel-ldpe") and args[2:] == ["--split", "dev"]
    assert evaluate.nmt_eval_args(["--package", "p"]) == ["--package", "p"]


def test_evaluate_passes_every_argument_on_in_order() -> None:
    argv = ["--split", "dev", "--limit", "5", "--target-length", "auto", "-o", "x"]
    assert evaluate.passed_on(argv) == argv
