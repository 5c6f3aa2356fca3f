"""Int8 weights for one nmt-export graph, activations quantized per row as the graph runs.

    python3 quantize.py IN.onnx OUT.onnx --weight-bits {8,7} [--logits NAME]

Every MatMul against a stored matrix `W [K, N]` becomes an integer product:

- weights: int8, symmetric, one scale per output column (`max |W[:, n]| / qmax`); qmax is 127
  for 8-bit weights and 63 for 7-bit ones;
- activations: each row of the input (one token of one sentence) on its own scale,
  `max |x_row| / 127`, to uint8 around the zero point 128 (Abs, ReduceMax, Div, then
  QuantizeLinear with scale 1, which only rounds and shifts), so a row's result never
  depends on the other rows of its batch;
- ONNX Runtime's `MatMulIntegerToFloat` (contrib domain, its u8s8 kernel), which multiplies
  the integer product by the row's and the column's scale as it writes it.

Inputs read by several weight MatMuls (a layer's Q, K and V projections) are quantized once.

Why not ONNX Runtime's own quantizers: `quantize_dynamic` quantizes the activations with one
scale per tensor (DynamicQuantizeLinear), i.e. per batch, so the same sentence translated alone
and beside others got different translations (295 of 461 Bible verses agreed); the weight-only
`MatMulNBits` (8-bit, accuracy level 4) is row-exact but, on ONNX Runtime 1.31's CPU kernels,
slower than float32 at 32 rows (docs/model-package.md, "Int8").

Weight range: x86 CPUs without VNNI multiply uint8 by int8 with an instruction that saturates
at 16 bits (vpmaddubsw: a0*b0 + a1*b1 must stay within ±32767); with activations up to 255,
weights of up to ±63 (7 bits) never saturate, full 8-bit weights can. `nmt-export quantize`
picks 8 bits where the CPU quantizing has VNNI and records the choice in the manifest.

The tied output projection (`logits = x @ E^T`, a Gemm with transB that reads the embedding
table) is first rewritten as a MatMul against its own stored transpose. Embedding tables of
at least 1,024 rows (the vocabulary's) are then stored as int8 rows, one float32 scale a row,
and looked up as a `Gather` of each, a `Cast` and a `Mul`: a lookup has no arithmetic to save,
but every session keeps its own copy of its tables (the encoder, and the decoder of every
model worker), 12 MB a float32 table of 12,000 subwords at width 256. Smaller tables (Shaw's
relative tables, positions) stay float32, and so do recurrent layers (GRU, LSTM): ONNX has no
integer recurrent op.

Prints a JSON report of what was quantized on stdout. `nmt-export quantize` runs this: the
binary carries this file (include_str!) and runs it with `python3 -c`, so it imports nothing
but the standard library, numpy, onnx and onnxruntime. Checked with the tools/ package's ruff
and mypy rules (tools/check.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import NoReturn

try:
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
except ImportError as error:
    sys.stderr.write(
        "int8 quantization needs numpy, onnx and onnxruntime "
        f"(scripts/setup.sh installs onnxruntime==1.31.1 onnx==1.23.2) ({error})\n"
    )
    sys.exit(3)

# ONNX Runtime's contrib ops: MatMulIntegerToFloat scales an integer product per row and
# per column as it writes it.
CONTRIB_DOMAIN = "com.microsoft"
# ReduceMax takes its axes as an input from this opset on, as an attribute before.
AXES_AS_INPUT = 18
ACTIVATION_ZERO_POINT = 128
ACTIVATION_QMAX = 127
# A row of zeros gets this absolute maximum, so its scale is not 0 and it quantizes to 128s.
TINY = 1e-30
# The fused operators' domain (model_package::names::FUSED_DOMAIN) and the int8 product in it
# (names::ROW_QUANTIZED_MATMUL), whose kernel is engine/src/row_int8.rs.
FUSED_DOMAIN = "nmt"
FUSED_DOMAIN_VERSION = 1
ROW_QUANTIZED_MATMUL = "RowQuantizedMatMul"
# Lookup tables of at least this many rows are stored as int8 rows; the int8 range of a lookup
# is always the full one (no integer product to saturate).
LOOKUP_ROWS = 1024
LOOKUP_QMAX = 127


def fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(2)


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in graph.node for output in node.output}


def initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {tensor.name: tensor for tensor in graph.initializer}


def weight_matmuls(graph: onnx.GraphProto) -> list[int]:
    """Indices of the MatMuls whose B is a stored float matrix of more than one column: the
    ones that become integer products. A one-column product (the encoder's length head) is a
    dot product per row, where quantizing would save nothing and move the predicted lengths."""
    stored = initializers(graph)
    return [
        i
        for i, n in enumerate(graph.node)
        if n.op_type == "MatMul"
        and n.input[1] in stored
        and len(stored[n.input[1]].dims) == 2
        and stored[n.input[1]].data_type == TensorProto.FLOAT
        and stored[n.input[1]].dims[1] > 1
    ]


def logits_projection(graph: onnx.GraphProto, logits: str) -> onnx.NodeProto | None:
    """The projection computing graph output `logits`, past any Identity and any Add of a
    stored bias (an imported Marian model adds `final_logits_bias`); None without one."""
    if not any(output.name == logits for output in graph.output):
        return None
    by_output = producers(graph)
    stored = initializers(graph)
    node = by_output[logits]
    while True:
        computed = [value for value in node.input if value in by_output]
        if node.op_type == "Identity":
            node = by_output[node.input[0]]
        elif node.op_type == "Add" and len(computed) == 1 and any(v in stored for v in node.input):
            node = by_output[computed[0]]
        else:
            return node


def untie_logits(graph: onnx.GraphProto, logits: str) -> bool:
    """Rewrites `Gemm(x, E, transB=1)` as `MatMul(x, E^T)` with E^T stored; returns whether
    the graph had such a projection to rewrite."""
    node = logits_projection(graph, logits)
    stored = initializers(graph)
    if node is None or (node.op_type == "MatMul" and node.input[1] in stored):
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plain = attributes.get("alpha", 1.0) == 1.0 and attributes.get("transA", 0) == 0
    if not (
        node.op_type == "Gemm"
        and attributes.get("transB", 0) == 1
        and plain
        and len(node.input) == 2
        and node.input[1] in stored
    ):
        fail(
            f"{logits} is computed by {node.op_type} {node.name!r}, not by a projection with a "
            "stored matrix (MatMul, or Gemm with transB): cannot quantize it"
        )
    table = numpy_helper.to_array(stored[node.input[1]])
    name = fresh_name(graph, node.input[1] + ".transposed")
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table.T), name))
    node.op_type = "MatMul"
    node.input[1] = name
    del node.attribute[:]
    # The table stays: the embedding lookup still reads it.
    return True


def quantize_lookups(graph: onnx.GraphProto) -> int:
    """Rewrites each `Gather(E, ids)` along axis 0 of a stored float32 table of at least
    LOOKUP_ROWS rows as `Cast(Gather(E_int8, ids)) * Gather(scales, ids)`, one scale a row
    (its absolute maximum over LOOKUP_QMAX), and drops the float table; returns how many."""
    stored = initializers(graph)
    order: list[onnx.NodeProto] = []
    # Each table's int8 rows and scales, by the float table's name.
    tables: dict[str, tuple[str, str]] = {}
    for node in graph.node:
        table = stored.get(node.input[0]) if node.op_type == "Gather" else None
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        if (
            table is None
            or axis != 0
            or table.data_type != TensorProto.FLOAT
            or len(table.dims) != 2
            or table.dims[0] < LOOKUP_ROWS
        ):
            order.append(node)
            continue
        if node.input[0] not in tables:
            values, scale = quantized_weight(numpy_helper.to_array(table), LOOKUP_QMAX, axis=1)
            names = (
                fresh_name(graph, node.input[0] + ".int8.rows"),
                fresh_name(graph, node.input[0] + ".int8.row_scales"),
            )
            graph.initializer.append(numpy_helper.from_array(values, names[0]))
            graph.initializer.append(numpy_helper.from_array(scale, names[1]))
            tables[node.input[0]] = names
        rows, scales = tables[node.input[0]]
        ids, out = node.input[1], node.output[0]
        looked_up, row_scale, widened = (fresh_name(graph, f"{out}.{part}") for part in ("int8", "scale", "float"))
        order += [
            helper.make_node("Gather", [rows, ids], [looked_up], name=f"{node.name}.int8", axis=0),
            helper.make_node("Gather", [scales, ids], [row_scale], name=f"{node.name}.scale", axis=0),
            helper.make_node("Cast", [looked_up], [widened], name=f"{node.name}.cast", to=TensorProto.FLOAT),
            helper.make_node("Mul", [widened, row_scale], [out], name=f"{node.name}.scaled"),
        ]
    order = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]
    del graph.node[:]
    graph.node.extend(order)
    still_read = {v for n in graph.node for v in n.input}
    for tensor in [t for t in graph.initializer if t.name in tables and t.name not in still_read]:
        graph.initializer.remove(tensor)
    return len(tables)


def fresh_name(graph: onnx.GraphProto, wanted: str) -> str:
    taken = {v for n in graph.node for v in list(n.input) + list(n.output)}
    taken |= {t.name for t in graph.initializer} | {n.name for n in graph.node}
    name = wanted
    while name in taken:
        name += "_"
    return name


def quantized_weight(weight: np.ndarray, qmax: int, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """int8 weights and float32 scales, one scale per slice across `axis` (kept as a length-1
    axis): per output column of a product's `[in, out]` matrix for axis 0, per row of a lookup
    table for axis 1. An all-zero slice keeps scale 1 (its values are 0 whatever the scale)."""
    peak = np.abs(weight).max(axis=axis, keepdims=True)
    scale = np.where(peak > 0, peak / qmax, 1.0).astype(np.float32)
    # np.round rounds half to even, as ONNX's QuantizeLinear does.
    values = np.clip(np.round(weight / scale), -qmax, qmax).astype(np.int8)
    return values, scale


def row_quantized_matmul(opset: int) -> onnx.FunctionProto:
    """The body of `nmt.RowQuantizedMatMul(x, weights, scales)`: the per-row quantization and
    integer product that the unfused graph spells out (`Rewriter.row_quantized`), which a
    runtime without the engine's kernel inlines and runs."""

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    if opset >= AXES_AS_INPUT:
        peak = [
            constant("axes", np.array([-1], np.int64)),
            helper.make_node("ReduceMax", ["abs", "axes"], ["peak"], keepdims=1),
        ]
    else:
        peak = [helper.make_node("ReduceMax", ["abs"], ["peak"], axes=[-1], keepdims=1)]
    nodes = [
        constant("tiny", np.array(TINY, np.float32)),
        constant("inverse_qmax", np.array(1.0 / ACTIVATION_QMAX, np.float32)),
        constant("one", np.array(1.0, np.float32)),
        constant("zero_point", np.array(ACTIVATION_ZERO_POINT, np.uint8)),
        helper.make_node("Abs", ["x"], ["abs"]),
        *peak,
        helper.make_node("Max", ["peak", "tiny"], ["peak_nonzero"]),
        helper.make_node("Mul", ["peak_nonzero", "inverse_qmax"], ["scale"]),
        helper.make_node("Div", ["x", "scale"], ["steps"]),
        helper.make_node("QuantizeLinear", ["steps", "one", "zero_point"], ["values"]),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["values", "weights", "scale", "scales", "zero_point"],
            ["product"],
            domain=CONTRIB_DOMAIN,
        ),
        # The bias as its own Add, as in the unfused graph (see `Rewriter.replace`).
        helper.make_node("Add", ["product", "bias"], ["y"]),
    ]
    return helper.make_function(
        FUSED_DOMAIN,
        ROW_QUANTIZED_MATMUL,
        ["x", "weights", "scales", "bias"],
        ["y"],
        nodes,
        [helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB_DOMAIN, 1)],
        doc_string=(
            "x W + bias with int8 weights [K, N], one float scale per column and a float bias "
            "[N]; each row of x quantized to uint8 on its own scale max(max |x_row|, 1e-30) / "
            "127 around 128."
        ),
    )


class Rewriter:
    """Replaces weight MatMuls by per-row integer products, sharing each input's quantization."""

    def __init__(self, graph: onnx.GraphProto, opset: int, weight_qmax: int, fused: bool) -> None:
        self.graph = graph
        self.fused = fused
        self.opset = opset
        self.weight_qmax = weight_qmax
        # The float weights, read once: the tensors the rewrite adds are never looked up.
        self.stored = initializers(graph)
        self.rows: dict[str, tuple[str, str]] = {}
        # Who reads each value (index, node), and the bias Adds the fused products absorb.
        self.readers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
        for at, node in enumerate(graph.node):
            for value in node.input:
                self.readers.setdefault(value, []).append((at, node))
        self.graph_outputs = {o.name for o in graph.output}
        self.absorbed: set[int] = set()
        self.nodes: dict[int, list[onnx.NodeProto]] = {}
        self.constants: dict[str, str] = {}

    def constant(self, key: str, value: np.ndarray) -> str:
        if key not in self.constants:
            name = fresh_name(self.graph, f"row_int8.{key}")
            self.graph.initializer.append(numpy_helper.from_array(value, name))
            self.constants[key] = name
        return self.constants[key]

    def row_peak(self, absolute: str, peak: str) -> onnx.NodeProto:
        """ReduceMax over the last axis, kept as an axis of 1, in the graph's opset."""
        if self.opset >= AXES_AS_INPUT:
            axes = self.constant("axes", np.array([-1], np.int64))
            return helper.make_node("ReduceMax", [absolute, axes], [peak], name=peak, keepdims=1)
        return helper.make_node("ReduceMax", [absolute], [peak], name=peak, axes=[-1], keepdims=1)

    def row_quantized(self, x: str, at: int) -> tuple[str, str]:
        """(uint8 rows, float scale per row [.., 1]) of activation `x`, built before node `at`."""
        if x in self.rows:
            return self.rows[x]
        p = fresh_name(self.graph, f"{x}.row_int8")
        tiny = self.constant("tiny", np.array(TINY, np.float32))
        per_step = self.constant("inverse_qmax", np.array(1.0 / ACTIVATION_QMAX, np.float32))
        one = self.constant("one", np.array(1.0, np.float32))
        zero_point = self.constant("zero_point", np.array(ACTIVATION_ZERO_POINT, np.uint8))
        nodes = [
            helper.make_node("Abs", [x], [f"{p}.abs"], name=f"{p}.abs"),
            self.row_peak(f"{p}.abs", f"{p}.peak"),
            helper.make_node("Max", [f"{p}.peak", tiny], [f"{p}.peak_nonzero"], name=f"{p}.peak_nonzero"),
            helper.make_node("Mul", [f"{p}.peak_nonzero", per_step], [f"{p}.scale"], name=f"{p}.scale"),
            # x / scale lies within ±127, so the per-tensor QuantizeLinear with scale 1 only
            # rounds (half to even) and shifts by the zero point: ONNX Runtime's fast path.
            helper.make_node("Div", [x, f"{p}.scale"], [f"{p}.steps"], name=f"{p}.steps"),
            helper.make_node("QuantizeLinear", [f"{p}.steps", one, zero_point], [f"{p}.values"], name=f"{p}.values"),
        ]
        self.nodes.setdefault(at, []).extend(nodes)
        self.rows[x] = (f"{p}.values", f"{p}.scale")
        return self.rows[x]

    def replace(self, node: onnx.NodeProto, at: int) -> None:
        weight = numpy_helper.to_array(self.stored[node.input[1]])
        values, scale = quantized_weight(weight, self.weight_qmax)
        scale = scale.reshape(-1)
        p = fresh_name(self.graph, f"{node.input[1]}.int8")
        self.graph.initializer.extend(
            [numpy_helper.from_array(values, f"{p}.values"), numpy_helper.from_array(scale, f"{p}.scale")]
        )
        if self.fused:
            bias, output = self.folded_bias(node, values.shape[1], p)
            self.nodes.setdefault(at, []).append(
                helper.make_node(
                    ROW_QUANTIZED_MATMUL,
                    [node.input[0], f"{p}.values", f"{p}.scale", bias],
                    [output],
                    name=node.name or p,
                    domain=FUSED_DOMAIN,
                )
            )
            return
        rows, row_scale = self.row_quantized(node.input[0], at)
        inputs = [rows, f"{p}.values", row_scale, f"{p}.scale", self.constants["zero_point"]]
        # A bias stays a separate Add: ONNX Runtime 1.31 applies a per-row scale after adding
        # MatMulIntegerToFloat's bias input, so the bias would be scaled too; for the same
        # reason the graph does not spell the product as MatMulInteger -> Cast -> Mul, which
        # ONNX Runtime's optimizer fuses into that op together with the next Add.
        self.nodes.setdefault(at, []).append(
            helper.make_node(
                "MatMulIntegerToFloat", inputs, [node.output[0]], name=node.name or p, domain=CONTRIB_DOMAIN
            )
        )

    def folded_bias(self, node: onnx.NodeProto, columns: int, p: str) -> tuple[str, str]:
        """(bias, output) of the fused product of `node`: the stored bias `[N]` of the Add that
        alone reads its result, which the product then absorbs (one node fewer a product), or
        zeros where there is none (`x + 0` is `x` bit for bit)."""
        readers = self.readers.get(node.output[0], [])
        if len(readers) == 1 and node.output[0] not in self.graph_outputs:
            at, add = readers[0]
            bias = next((v for v in add.input if v != node.output[0]), "")
            stored = self.stored.get(bias)
            if (
                add.op_type == "Add"
                and list(add.input).count(node.output[0]) == 1
                and stored is not None
                and stored.data_type == TensorProto.FLOAT
                and list(stored.dims) == [columns]
            ):
                self.absorbed.add(at)
                return bias, add.output[0]
        zeros = f"{p}.no_bias"
        self.graph.initializer.append(numpy_helper.from_array(np.zeros(columns, np.float32), zeros))
        return zeros, node.output[0]

    def run(self) -> int:
        targets = set(weight_matmuls(self.graph))
        weights_read = {self.graph.node[i].input[1] for i in targets}
        kept: dict[int, onnx.NodeProto] = {}
        for at, node in enumerate(self.graph.node):
            if at in targets:
                self.replace(node, at)
            else:
                kept[at] = node
        for at in self.absorbed:
            del kept[at]
        # The new nodes go where the MatMul was, which keeps the graph topologically sorted:
        # a shared input's quantization goes before its first reader.
        order: list[onnx.NodeProto] = []
        for at in range(len(self.graph.node)):
            order.extend(self.nodes.get(at, []))
            if at in kept:
                order.append(kept[at])
        # Copies: the kept nodes are views into the field that is about to be cleared.
        order = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]
        del self.graph.node[:]
        self.graph.node.extend(order)
        still_read = {v for n in self.graph.node for v in n.input}
        unused = [t for t in self.graph.initializer if t.name in weights_read and t.name not in still_read]
        for tensor in unused:
            self.graph.initializer.remove(tensor)
        return len(targets)


def quantize(
    model: onnx.ModelProto, logits: str, weight_bits: int, fused: bool
) -> tuple[onnx.ModelProto, dict[str, object]]:
    untied = untie_logits(model.graph, logits)
    if not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    rewriter = Rewriter(model.graph, opset, (1 << (weight_bits - 1)) - 1, fused)
    replaced = rewriter.run()
    lookups = quantize_lookups(model.graph)
    if fused:
        if not any(o.domain == FUSED_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, FUSED_DOMAIN_VERSION))
        model.functions.append(row_quantized_matmul(opset))
    product = ROW_QUANTIZED_MATMUL if fused else "MatMulIntegerToFloat"
    integer = sum(n.op_type == product for n in model.graph.node)
    left = [model.graph.node[i].name for i in weight_matmuls(model.graph)]
    if left or integer != replaced:
        fail(f"{replaced} weight MatMuls, {integer} quantized; still float: {left}")
    if fused:
        # onnx's shape inference does not know ONNX Runtime's contrib ops, so it cannot type
        # the body's MatMulIntegerToFloat; ONNX Runtime, which inlines the body, checks instead.
        onnx.checker.check_model(model)
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        onnx.checker.check_model(model, full_check=True)
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return model, {
        "weight_matmuls": replaced,
        "matmul_integer": integer,
        "row_quantizers": len(rewriter.rows),
        "untied_logits": untied,
        "int8_lookups": lookups,
        "op_counts": dict(sorted(ops.items())),
    }


def write_atomically(model: onnx.ModelProto, output: str) -> None:
    directory = os.path.dirname(os.path.abspath(output))
    handle, temporary = tempfile.mkstemp(suffix=".onnx", dir=directory)
    os.close(handle)
    # mkstemp makes the file private; the package's other files follow the umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    try:
        onnx.save(model, temporary)
        os.replace(temporary, output)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--weight-bits", type=int, choices=[7, 8], required=True, help="range of the int8 weights")
    parser.add_argument("--logits", default="logits", help="graph output of the vocabulary scores")
    parser.add_argument(
        "--unfused",
        action="store_true",
        help="spell each product out as standard nodes instead of nmt.RowQuantizedMatMul",
    )
    args = parser.parse_args()

    model, graph = quantize(onnx.load(args.input), args.logits, args.weight_bits, not args.unfused)
    write_atomically(model, args.output)
    print(
        json.dumps(
            {
                "op_types": ["MatMul", "Gather"],
                "onnxruntime": onnxruntime.__version__,
                "onnx": onnx.__version__,
                "graph": graph,
            }
        )
    )


if __name__ == "__main__":
    main()
