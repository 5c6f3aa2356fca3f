"""The benchmarks' planning and reports, without a model or a CTranslate2 install."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import REPO

from nmt_tools.ct2 import cells, compare, convert, report, worker
from nmt_tools.int8 import presets
from nmt_tools.server import Limit

BENCHMARKS = REPO / "docs" / "benchmarks"
LIMITS = {
    "--max-length-ratio": Limit("--max-length-ratio", "NMT_MAX_LENGTH_RATIO", 2.0),
    "--max-length-offset": Limit("--max-length-offset", "NMT_MAX_LENGTH_OFFSET", 10),
}


def compare_args(*argv: str) -> argparse.Namespace:
    return compare.parse_args(["--package", "pkg", *argv])


def test_cells_of_a_run() -> None:
    args = compare_args("--ct2-threads", "1", "--our-threads", "1", "--our-threads-one", "1", "--server-threads", "1")
    planned = cells.cells_for(args, {"float32": "/p/f32", "int8": "/p/i8"})
    ids = [c["id"] for c in planned]
    assert ids[:5] == [
        "ct2-float32-one-inter1-intra1",
        "engine-float32-one-t1",
        "server-float32-one-t1",
        "ct2-float32-concurrent-inter1-intra1",
        "ct2-float32-concurrent-inter2-intra1",
    ]
    assert "server-int8-concurrent-t1-w2" in ids and len(ids) == len(set(ids))
    # CTranslate2's batching on both cores: two replicas, each decoding a batch, at each size.
    assert {"ct2-int8-batch-inter2-intra1-b8", "ct2-int8-batch-inter2-intra1-b32"} <= set(ids)
    assert args.ct2_omp_wait_policy == "", "CTranslate2 runs with libgomp's own wait policy"
    # Without an int8 package, CTranslate2 still runs int8 (its own quantization).
    only_f32 = [c["id"] for c in cells.cells_for(args, {"float32": "/p/f32"})]
    assert "ct2-int8-batch-inter1-intra1-b16" in only_f32 and not any(i.startswith("engine-int8") for i in only_f32)


def test_each_batch_size_is_a_cell_on_both_sides_and_the_goal_takes_ct2s_best() -> None:
    args = compare_args("--ct2-threads", "1", "--our-threads", "1", "--batch-size", "8,32", "--only", "batch")
    planned = [c for c in cells.cells_for(args, {"float32": "/p/f32", "int8": "/p/i8"}) if c["mode"] == "batch"]
    by_id = {c["id"]: c for c in planned}
    for size in (8, 32):
        ct2 = by_id[f"ct2-int8-batch-inter2-intra1-b{size}"]
        assert ct2["batch_size"] == size and ct2["threads"] == f"inter 2 x intra 1, batches of {size}"
        command = cells.worker_command(ct2, args, Path("/w/m"), LIMITS)
        assert command[command.index("--batch-size") + 1] == str(size)
        engine = cells.worker_command(by_id[f"engine-int8-batch-t1-b{size}"], args, Path("/w/m"), LIMITS)
        assert engine[engine.index("--batch-size") + 1] == str(size)
    # One size: the ids and rows of the runs before the sweep.
    one = compare_args("--batch-size", "32")
    assert "ct2-int8-batch-inter2-intra1" in [c["id"] for c in cells.cells_for(one, {"float32": "/p/f32"})]

    run = {
        "cells": [
            cell("ct2-batch-b8", cells.CT2, "int8", "batch", 6000, 150),
            cell("ct2-batch-b32", cells.CT2, "int8", "batch", 5000, 120),
            cell("server-concurrent", cells.SERVER, "int8", "concurrent", 7500, 180),
        ],
        "clients": 64,
        "batch_sizes": [8, 32],
    }
    goal = report.goal_ratios(run)[0]
    assert goal["ct2_cell"] == "ct2-batch-b8" and goal["ratio"] == pytest.approx(1.25)
    assert report.mode_title("batch", run) == "sorted batches"
    assert "batches of 8 and 32 (each size a row of its own)" in "\n".join(report.modes_explained(run | LIMITS_RUN))


LIMITS_RUN = {"limits": {"NMT_MAX_LENGTH_RATIO": 2.0, "NMT_MAX_LENGTH_OFFSET": 10}}


def test_ct2_workers_get_the_servers_limits() -> None:
    args = compare_args()
    cell = cells.cells_for(args, {"float32": "/p/f32"})[0]
    command = cells.worker_command(cell, args, Path("/w/ct2-model"), LIMITS)
    assert command[1:3] == ["-m", "nmt_tools.ct2.worker"]
    assert command[-4:] == ["--max-length-ratio", "2.0", "--max-length-offset", "10"]
    parsed = worker.parser().parse_args(command[3:] + ["--max-input-tokens", "1024", "--max-output-tokens", "1024"])
    assert parsed.max_length_ratio == 2.0 and parsed.mode == "one"


def test_a_pass_reports_refusals() -> None:
    outcomes = [worker.Outcome("hola", 3, False, False), worker.REFUSED, worker.Outcome("x", 5, True, False)]
    answer = worker.pass_answer(outcomes, 2.0)
    assert answer.pop("peak_rss_mib") > 10, "the worker's own peak memory, Python included"
    assert answer == {
        "sentences": 3,
        "output_tokens": 8,
        "seconds": 2.0,
        "errors": 1,
        "hit_budget": 1,
        "error": "1 inputs refused",
    }


def test_ct2_page_from_a_recorded_run() -> None:
    recorded = json.loads((BENCHMARKS / "ctranslate2.json").read_text())
    page = report.markdown(recorded)
    assert page.startswith("# This server against CTranslate2, same weights\n")
    assert "Written by `python3 -m nmt_tools.ct2.compare`" in page
    assert "| CTranslate2 | float32 | intra 1 |" in page
    assert report.ratios(recorded) == recorded["ratios"]
    assert report.agreement(["a", "b", "c"], ["a", "x"]) == {"agree": 1, "of": 3, "differ": [1, 2]}


def cell(cid: str, system: str, precision: str, mode: str, tokens: int, sentences: int) -> dict[str, object]:
    passes = [{"output_tokens": tokens, "sentences": sentences, "seconds": 1.0, "peak_rss_mib": 100.0}]
    result = report.summary(passes)
    return {"id": cid, "system": system, "precision": precision, "mode": mode, "threads": "t", "result": result}


def test_the_goal_compares_many_clients_with_ct2_batching_too() -> None:
    run = {
        "cells": [
            cell("ct2-one", cells.CT2, "int8", "one", 1000, 30),
            cell("ct2-concurrent", cells.CT2, "int8", "concurrent", 3000, 90),
            cell("ct2-batch", cells.CT2, "int8", "batch", 6000, 150),
            cell("server-one", cells.SERVER, "int8", "one", 1300, 40),
            cell("server-concurrent", cells.SERVER, "int8", "concurrent", 7500, 180),
            cell("engine-batch", cells.ENGINE, "int8", "batch", 9000, 200),
        ],
        "clients": 64,
        "batch_size": 32,
    }
    goals = {g["mode"]: g for g in report.goal_ratios(run)}
    assert goals["one"]["ct2_cell"] == "ct2-one" and goals["one"]["ratio"] == pytest.approx(1.3)
    # 64 clients meet CTranslate2's batches, not only its one-sentence calls.
    assert goals["concurrent"]["ct2_cell"] == "ct2-batch"
    assert goals["concurrent"]["ratio"] == pytest.approx(1.25)
    assert goals["concurrent"]["sentences_ratio"] == pytest.approx(1.2)
    run["goal_ratios"] = report.goal_ratios(run)
    page = "\n".join(report.goal_table(run) + report.per_cell_table(run))
    assert "| int8 | 64 | `server-concurrent` | 7500 | `ct2-batch` | 6000 | 1.25 | 1.20 |" in page
    assert "| `ct2-batch` | CTranslate2 | int8 | t | batches of 32 | 6000 | 150.0 | 100 |" in page

    recorded = json.loads((BENCHMARKS / "int8-presets.json").read_text())
    assert presets.markdown(recorded) == (BENCHMARKS / "int8-presets.md").read_text()


def test_conversion_refuses_what_ctranslate2_cannot_compute() -> None:
    plain = {
        "preset": "rel-transformer",
        "architecture": "transformer",
        "norm": "pre",
        "recurrent_position": "none",
        "length_encoding": "none",
        "absolute_position": "none",
        "relative_attention": "keys_values",
    }
    convert.supported(plain)
    with pytest.raises(convert.Refused, match="length_encoding"):
        convert.supported(plain | {"length_encoding": "ldpe"})
    with pytest.raises(convert.Refused, match="keys_only"):
        convert.supported(plain | {"relative_attention": "keys_only"})


def test_vocabulary_of_a_unigram_tokenizer(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    model = {"type": "Unigram", "vocab": [["<pad>", 0], ["<s>", 0], ["▁a", -1.0]]}
    tokenizer.write_text(json.dumps({"model": model, "added_tokens": [{"id": 1, "content": "<s>"}]}))
    assert convert.vocabulary(tokenizer, 3) == ["<pad>", "<s>", "▁a"]
    with pytest.raises(ValueError, match="pieces"):
        convert.vocabulary(tokenizer, 4)


def test_sinusoid_table_interleaves_sin_and_cos() -> None:
    np = pytest.importorskip("numpy")
    table = convert.sinusoid_table(np.array([1.0, 0.5], dtype=np.float32), 3)
    assert table.shape == (3, 4)
    assert np.allclose(table[2], [np.sin(2.0), np.cos(2.0), np.sin(1.0), np.cos(1.0)])


def test_dispatch_floor_runs_on_onnx_runtime() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from nmt_tools.decoding import step_floor

    model, feeds = step_floor.dispatch_chain(6, 8)
    session = step_floor.session(model)
    assert session.run(None, feeds)[0].shape == (1, 8)
    assert step_floor.time_runs(session, feeds, 20) > 0
