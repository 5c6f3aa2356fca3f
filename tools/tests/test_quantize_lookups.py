"""The int8 quantizer's lookups (model-export/python/quantize.py, `quantize_lookups`): a large
embedding table becomes int8 rows with a scale each, looked up to within half a step of the
float table; small tables and other axes stay as they were. The Rust tests quantize tiny
models whose vocabularies are below the size this applies to."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import numpy as np
import onnx
import onnxruntime
from conftest import REPO
from onnx import TensorProto, helper, numpy_helper


def quantizer() -> ModuleType:
    path = REPO / "model-export" / "python" / "quantize.py"
    spec = importlib.util.spec_from_file_location("quantize_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lookups(tables: dict[str, np.ndarray]) -> onnx.ModelProto:
    """One `Gather(table, ids)` a table, each with its own ids input and output."""
    nodes = [
        helper.make_node("Gather", [name, f"{name}.ids"], [f"{name}.out"], name=f"{name}.gather") for name in tables
    ]
    graph = helper.make_graph(
        nodes,
        "lookups",
        [helper.make_tensor_value_info(f"{name}.ids", TensorProto.INT64, ["n"]) for name in tables],
        [helper.make_tensor_value_info(f"{name}.out", TensorProto.FLOAT, ["n", 16]) for name in tables],
        [numpy_helper.from_array(table, name) for name, table in tables.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ONNX Runtime 1.31 reads; onnx 1.23 writes a newer one
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in session.run(None, feeds)]


def test_a_vocabulary_table_is_looked_up_as_int8_rows_and_a_small_one_stays_float() -> None:
    rng = np.random.default_rng(7)
    vocabulary = (rng.standard_normal((2048, 16)) * rng.uniform(0.01, 3.0, (2048, 1))).astype(np.float32)
    vocabulary[5] = 0.0  # a row of zeros keeps scale 1 and looks up as zeros
    small = rng.standard_normal((33, 16)).astype(np.float32)
    model = lookups({"embed": vocabulary, "relative": small})
    ids = np.array([0, 5, 2047, 17, 5], dtype=np.int64)
    feeds = {"embed.ids": ids, "relative.ids": ids % 33}
    before = run(model, feeds)

    assert quantizer().quantize_lookups(model.graph) == 1
    onnx.checker.check_model(model)
    stored = {t.name: t for t in model.graph.initializer}
    assert "embed" not in stored and "relative" in stored
    assert stored["embed.int8.rows"].data_type == TensorProto.INT8
    assert list(stored["embed.int8.row_scales"].dims) == [2048, 1]

    after = run(model, feeds)
    np.testing.assert_array_equal(after[1], before[1])
    step = np.abs(vocabulary[ids]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(after[0] - before[0]) <= step / 2 + 1e-7)
    np.testing.assert_array_equal(after[0][1], np.zeros(16, dtype=np.float32))
