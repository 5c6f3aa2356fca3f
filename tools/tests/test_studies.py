"""The studies' pages from a small study on disk, against pages the scripts wrote before
their prose moved into templates (tests/golden/, written from the same fixture), and the
template syntax."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest
import study_fixture as fx
from conftest import TESTS

from nmt_tools.studies import (
    candidate_choice,
    char_length,
    exact_endings,
    length_control,
    length_generalization,
    length_study,
    position_study,
)
from nmt_tools.studies.template import Template

GOLDEN = TESTS / "golden"


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture study in a working directory of its own, with a fixed commit and CPU."""
    fx.write_study(tmp_path)
    fx.write_length_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(position_study, "short_commit", lambda: "abc1234")
    monkeypatch.setattr(position_study, "cpu_model", lambda: "Test CPU")
    return tmp_path


def test_position_study_page(study: Path) -> None:
    argv = ["report", "study", "docs/position-study.md", "--record", "record", "--cap", str(fx.CAP)]
    argv += ["--terciles", *map(str, fx.TERCILES), "--steps", "1500", "--models", *fx.MODELS]
    argv += ["--thirds-models", *fx.THIRDS_MODELS]
    assert position_study.main(argv) == 0
    page = (study / "docs" / "position-study.md").read_text()
    assert page == (GOLDEN / "position-study.md").read_text()
    assert (study / "docs" / "position-study" / "bleu-by-length-all.png").exists()


def test_full_size_page_sets_each_finding_beside_the_small_one(study: Path) -> None:
    """`report --beside` (scripts/position-study.sh --full): the models at both sizes and, per
    finding, whether its verdict changed. The -small evaluation here is the fixture's with
    finding 1's test made insignificant, so only that verdict changes."""
    full = fx.report(
        [f"{m}.short" for m in ("transformer", "rel-transformer", "rr-transformer")], ["1-32", "33-64", "65+"], True
    )
    fx.write_json(study / "full" / "eval-short" / "report.json", full)
    small = json.loads(json.dumps(full))
    for row in small["paired_bootstrap"]["by_bucket"]:
        if row["system"] == "rel-transformer.short" and row["bucket"] == "65+":
            row["bleu_p"] = 0.4
    fx.write_json(study / "small" / "report.json", small)
    template = fx.REPO / position_study.TEMPLATES / position_study.TEMPLATE_FILES["report-full"]
    argv = ["report", "full", "docs/full.md", "--record", "record", "--cap", str(fx.CAP), "--size", "full"]
    argv += ["--terciles", *map(str, fx.TERCILES), "--steps", "2400", "--template", str(template)]
    argv += ["--models", "transformer", "rel-transformer", "rr-transformer", "--thirds-models", *fx.THIRDS_MODELS]
    assert position_study.main([*argv, "--beside", "small"]) == 0
    page = (study / "docs" / "full.md").read_text()
    assert "## At two sizes" in page
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| ")}
    assert "| Rel-Transformer (Shaw, k=16)" in rows
    for size in ("-small", "full"):
        assert f"| RR-Transformer (GRU + Shaw) | {size} | " in page
    changed = [line for line in page.splitlines() if line.endswith("| **yes** |")]
    assert len(changed) == 1 and changed[0].startswith("| 1. Rel beyond the training lengths")
    assert "(p = 0.400): **did not hold** (no significant difference)" in changed[0]
    assert "4. **Sinusoidal" not in page and "5. **LSTM" not in page
    assert "6. **GRU positions beat the Transformer" in page
    # Length ratio and looping per bucket and joined group, both sizes: the fixture's 65+ bucket
    # (ratio 1.1 - 2 x 0.05, looping 2 x 5%) and 8 joined verses (ratio 1 - 8/20, looping 8/20).
    lengths = page[page.index("## Length and looping beyond the training lengths") :]
    assert "| Transformer (sinusoidal) | full | 1.10 / 0% | 1.05 / 5% | 1.00 / 10% | 0.90 / 10% |" in lengths
    assert lengths.count("| 0.60 / 40% |") == 6


def test_relabelled_decoding_keeps_everything_but_the_name(tmp_path: Path) -> None:
    def saved(name: str) -> dict[str, Any]:
        return {"provenance": {"set": "test"}, "decoded": {"info": {"name": name, "dir": "x"}, "seconds": 1.5}}

    fx.write_json(tmp_path / "decoded.json", saved("rel.short"))
    out = tmp_path / "sizes" / "rel.short.small.json"
    argv = ["relabel", str(tmp_path / "decoded.json"), str(out), "rel.short.small"]
    assert position_study.main(argv) == 0
    assert json.loads(out.read_text()) == saved("rel.short.small")


def test_length_encodings_page(study: Path) -> None:
    (study / "docs").mkdir()
    argv = ["length-encodings", "study", "docs/length-encodings.md", "--record", "record", "--steps", "1500"]
    assert position_study.main([*argv, "--models", *fx.LENGTH_MODELS]) == 0
    assert (study / "docs" / "length-encodings.md").read_text() == (GOLDEN / "length-encodings.md").read_text()


def test_length_study_page(study: Path) -> None:
    page = length_study.markdown(Path("out"), "runs/pkg/baseline", "models/aware", fx.PULLS, "A note.")
    assert page == (GOLDEN / "length-control.md").read_text()


def test_a_study_without_evaluations_says_so(study: Path) -> None:
    for folder in (study / "study").iterdir():
        if folder.name != "eval-all":
            for report in folder.glob("report.json"):
                os.remove(report)
    argv = ["report", "study", "docs/p.md", "--record", "record", "--cap", "32", "--terciles", "20", "35"]
    position_study.main([*argv, "--steps", "9", "--models", "transformer", "--thirds-models", "transformer"])
    page = (study / "docs" / "p.md").read_text()
    assert "10. **Trained on a third" in page and "not measured yet" in page
    assert "## (b)" not in page


def test_template_blocks_and_papers() -> None:
    t = Template("preamble\n<!-- block a -->\nx $value, $paper_one\n\n<!-- block paper-one -->\nOne et al.\n")
    assert t.text("a", value=3) == "x 3, One et al."
    assert t.lines("paper-one") == ["One et al."]
    with pytest.raises(KeyError, match="needs a value"):
        t.text("a")
    with pytest.raises(KeyError, match="no block"):
        t.text("b")


def test_a_template_over_another_replaces_only_its_own_blocks() -> None:
    base = Template("<!-- block intro -->\nfirst $n\n<!-- block outro -->\nend\n<!-- block paper-one -->\nOne\n")
    over = base.overridden_by(Template("<!-- block intro -->\nsecond $n, $paper_one\n"))
    assert over.text("intro", n=2) == "second 2, One"
    assert over.text("outro") == "end"
    assert base.text("intro", n=1) == "first 1"
    # The second budget's file only replaces blocks the first budget's page has.
    full = Template.load(fx.REPO / position_study.TEMPLATES / "position-study-full.template.md")
    budget2 = Template.load(fx.REPO / position_study.TEMPLATES / "position-study-full-dropout3.template.md")
    assert set(budget2.blocks) == {"intro", "lengths-intro", "training-outro"} <= set(full.blocks)


def test_repository_templates_have_every_block_the_code_uses() -> None:
    """Every block name the module renders (a literal argument of `t.text` or `t.lines`) is in
    one of the shipped templates."""
    tree = ast.parse(Path(position_study.__file__).read_text())
    used = {
        constant.value
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("text", "lines")
        and call.args
        for constant in ast.walk(call.args[0])
        if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
    }
    known: set[str] = set()
    for name in position_study.TEMPLATE_FILES.values():
        known |= set(Template.load(fx.REPO / position_study.TEMPLATES / name).blocks)
    assert len(used) > 30
    assert used <= known


def test_copy_task_scores() -> None:
    exact, per_position, mean_length = length_generalization.scores(["a b c", "d e"], ["a b c", "d x y"])
    assert exact == 0.5
    assert per_position == 4 / 5
    assert mean_length == 3.0


def test_char_length_section_counts_compliance_and_replaces_itself(tmp_path: Path) -> None:
    sources = ["In the beginning God created the heaven.", "Jesus wept."]
    references = ["En el principio creó Dios los cielos.", "Y lloró Jesús."]
    for name, texts, cut in [("default", ["En el principio Dios creó el cielo.", "Jesús lloró"], False)]:
        write_char_run(tmp_path / name, texts, cut, candidates=False)
    write_char_run(tmp_path / "isometric", ["En el principio creó Dios el cielo y la tierra.", "Lloró."], False)
    page = tmp_path / "length-control.md"
    page.write_text("# Length control\n\nbefore\n")
    char_length.update(page, char_length.section(tmp_path, sources, references, "models/p"))
    char_length.update(page, char_length.section(tmp_path, sources, references, "models/p"))
    text = page.read_text()
    assert text.count(char_length.BEGIN) == 1 and text.startswith("# Length control\n\nbefore\n")
    # 28 against 34 source characters is outside ±10%; the 11-character verse is within.
    default = next(line for line in text.splitlines() if line.startswith("| default request"))
    assert "| 50.0% | – | 50.0% |" in default
    iso = next(line for line in text.splitlines() if line.startswith("| isometric"))
    assert "| 2.0 |" in iso, "two candidates a text"
    assert "21→47*" in text
    assert char_length.isometric_compliant("abc", "a much longer text than abc")
    # Another system's outputs, and the references, measured by what the text alone says.
    (tmp_path / "apertium.es").write_text("En el principio creó Dios el cielo.\nJesús lloró.")
    text = char_length.section(tmp_path, sources, references, "models/p")
    apertium = next(line for line in text.splitlines() if line.startswith("| Apertium"))
    assert "| 50.0% | – | 100.0% | 100.0% |" in apertium and apertium.endswith("| – | – |")
    own = next(line for line in text.splitlines() if line.startswith("| the references"))
    assert own.startswith("| the references themselves | – | – | 50.0% | – | 100.0% |")


def write_char_run(folder: Path, texts: list[str], cut: bool, candidates: bool = True) -> None:
    """An nmt-eval report of one run, with its decoded translations."""
    (folder / "p").mkdir(parents=True)
    report = {
        "systems": [
            {
                "label": "p",
                "sentences_per_second": 10.0,
                "overall": {"bleu": {"score": 20.0, "ci": 1.0}, "chrf": {"score": 40.0}},
            }
        ]
    }
    (folder / "report.json").write_text(json.dumps(report))
    translations = []
    for text in texts:
        t: dict[str, object] = {"text": text, "truncated": cut}
        if candidates:
            t["candidates"] = [
                {"target_length": 21, "characters": len(text), "complies": True, "chosen": True},
                {"target_length": 30, "characters": 80, "complies": False, "chosen": False},
            ]
        translations.append(t)
    (folder / "p" / "decoded.json").write_text(json.dumps({"decoded": {"translations": translations}}))


def test_candidate_choice_rescores_recorded_candidates_by_each_rule(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "dev.en").write_text("In the beginning God created the heaven.\nJesus wept.\n")
    (corpus / "dev.es").write_text("En el principio creó Dios los cielos.\nY lloró Jesús.\n")
    references = ["En el principio creó Dios los cielos.", "Y lloró Jesús."]
    write_char_run(tmp_path / "default", references, False, False)
    write_char_run(tmp_path / "isometric", ["En el principio hizo Dios el cielo.", references[1]], False)
    decoded = tmp_path / "isometric" / "p" / "decoded.json"
    runs = json.loads(decoded.read_text())
    first = runs["decoded"]["translations"][0]
    # Mean log-probability -0.2 over 10 subwords beats -0.3 over 5 (the server's rule), but the
    # summed -1.5 beats -2.0 when length is not normalized (a = 0); the second text has no
    # compliant candidate that ended and keeps what the server returned.
    first["candidates"] = [
        {"text": "En el principio hizo Dios el cielo.", "score": -0.2, "output_tokens": 10},
        {"text": references[0], "score": -0.3, "output_tokens": 5},
    ]
    for c in first["candidates"]:
        c.update(complies=True, ended=True)
    runs["decoded"]["translations"][1]["candidates"] = [
        {"text": "Lloró.", "score": -0.1, "output_tokens": 2, "complies": True, "ended": False}
    ]
    decoded.write_text(json.dumps(runs))
    table = candidate_choice.table(tmp_path, corpus, "dev")
    bleu = {line.split(" | ")[0][2:]: float(line.split(" | ")[1]) for line in table.splitlines()[4:]}
    served = bleu["as served (mean log-probability; no repeated phrase first)"]
    assert bleu["the default request (no length asked)"] == 100.0
    assert served < 100.0 and bleu["summed log-probability / length^1"] == served
    assert bleu["summed log-probability / length^0"] == 100.0
    assert bleu["the default request's translation where it complies"] == 100.0


def test_exact_endings_section_counts_endings_and_keeps_the_characters_section(tmp_path: Path) -> None:
    sources = ["In the beginning God created the heaven.", "Who is he?"]
    references = ["En el principio creó Dios los cielos.", "¿Quién es él?"]
    write_char_run(tmp_path / "plans0", ["En el principio creó Dios. Y el", "¿Quién es él?"], False, candidates=False)
    write_char_run(tmp_path / "plans4", ["En el principio creó Dios los cielos.", "¿Quién es él."], False)
    decoded = tmp_path / "plans4" / "p" / "decoded.json"
    runs = json.loads(decoded.read_text())
    for t in runs["decoded"]["translations"]:
        t["output_tokens"] = 7
        for c in t["candidates"]:
            c["ended"] = c["chosen"]
            c["planned_length"] = 20
    plain = tmp_path / "plans0" / "p" / "decoded.json"
    plain.write_text(plain.read_text().replace('"truncated"', '"output_tokens": 7, "truncated"'))
    decoded.write_text(json.dumps(runs))
    page = tmp_path / "length-control.md"
    page.write_text(f"# Length control\n\n{char_length.BEGIN}\nchars\n{char_length.END}\n")
    for _ in range(2):
        text = exact_endings.section(tmp_path, sources, references, "models/p")
        char_length.update(page, text, exact_endings.BEGIN, exact_endings.END)
    text = page.read_text()
    assert text.count(exact_endings.BEGIN) == 1 and "chars\n" in text
    before = next(line for line in text.splitlines() if line.startswith("| `--exact-plans 0`"))
    assert "| 50.0% | 50.0% | – | 1.0 |" in before
    default = next(line for line in text.splitlines() if line.startswith("| `--exact-plans 4`"))
    # Both end in . ! ?, one as its source does ("?" against "."); both chosen rows closed.
    assert "| 100.0% | 50.0% | 100.0% | 2.0 |" in default
    assert "told: 20 closed*, 20" in text


def test_predictor_table_reads_each_packages_recorded_evaluation(tmp_path: Path) -> None:
    """A row per (set, estimate) the manifest records, variance ratios against the source's
    length, and the predictor graph's cost; sets it did not evaluate are left out."""
    figures = {
        "source_length": {
            "count": 10,
            "mean_error": -1.0,
            "error_variance": 20.0,
            "correlation": 0.9,
            "mean_absolute_error": 3.0,
        },
        "predictor": {
            "count": 10,
            "mean_error": 0.5,
            "error_variance": 8.0,
            "correlation": 0.95,
            "mean_absolute_error": 2.0,
        },
    }
    manifest = {
        "name": "pkg",
        "length_prediction": {
            "predictor": {
                "computes": "subword_table",
                "training": {"graph_seconds_per_source": 2e-6},
                "evaluation": {"test": figures},
            }
        },
    }
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "manifest.json").write_text(json.dumps(manifest))
    page = tmp_path / "page.md"
    page.write_text("# Page\n")
    assert length_control.main(["predictors", "--package", str(tmp_path / "pkg"), "--page", str(page)]) == 0
    text = page.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `pkg`")]
    assert len(rows) == 2
    assert "| the predictor (`subword_table`) | +0.50 | 8.00 | 0.40 | 0.950 | 2.00 | 0.0020 |" in rows[1]
    assert text.startswith("# Page\n") and text.count(length_control.PREDICTORS_BEGIN) == 1
    length_control.main(["predictors", "--package", str(tmp_path / "pkg"), "--page", str(page)])
    assert page.read_text() == text


def test_throughput_section_sets_each_request_kind_beside_the_first() -> None:
    def cell(mode: str, clients: int, rate: float) -> dict[str, object]:
        return {"mode": mode, "clients": clients, "requests_per_second": rate, "tokens_per_second": rate * 30}

    report = {
        "date": "2026-11-27T00:00:00Z",
        "verses": 461,
        "verses_file": "test.en",
        "nproc": 2,
        "warmup_seconds": 3.0,
        "seconds": 20.0,
        "server_args": [
            {"mode": "default", "request_fields": {}},
            {"mode": "isometric", "request_fields": {"target_chars": "source"}},
        ],
        "results": [cell("default", 1, 20.0), cell("default", 16, 60.0), cell("isometric", 1, 5.0)],
        "peak_rss_mib": [["default", 150.0], ["isometric", None]],
    }
    text = length_control.throughput_section(report, "models/x")
    assert '| isometric | `{"target_chars": "source"}` | 5.00 (0.25x) | – | 150 | – | – |' in text
    assert "| default | `{}` | 20.00 (1.00x) | 60.00 (1.00x) | 600 | 1800 | 150 MiB |" in text
