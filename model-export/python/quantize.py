"""Int8 weights for one nmt-export graph, by ONNX Runtime's own dynamic quantizer.

    python3 quantize.py IN.onnx OUT.onnx [--logits NAME]

Weights of every MatMul against a stored matrix become int8 with one scale per output
column (`quantize_dynamic`, QInt8, per_channel, reduce_range); activations are quantized to
uint8 per tensor when the graph runs. `reduce_range` keeps the weights to 7 bits: x86 CPUs
without VNNI multiply uint8 by int8 with an instruction that saturates at 16 bits, and full
8-bit weights lost a fifth of the tiny test models' teacher-forced agreement with float32 on
such a CPU (0.77-0.79; the test asks 0.95, which 8-bit weights met on the CPUs of earlier
runs). A package is quantized once and served on whatever CPU a deployment has, so it takes
the range every CPU computes exactly. The quantizer leaves a Gemm with transB alone, so the tied
output projection (`logits = x @ E^T`, the embedding table read transposed) is first
rewritten as a MatMul against its own stored transpose `[d, vocab]`.

Embedding lookups (Gather) stay float32: the quantizer can store a Gather's table only with
one scale for the whole table, a lookup has no arithmetic to save, and on the measured
Rel-Transformer it halved the package again but cost agreement with float32
(docs/model-package.md, "Int8").
Recurrent layers (GRU, LSTM) stay float32 too: ONNX Runtime quantizes LSTM only into its
own contrib op and GRU not at all, and the graphs keep to standard ONNX ops.

Prints a JSON report of what was quantized on stdout. `nmt-export quantize` runs this: the
binary carries this file (include_str!) and runs it with `python3 -c`, so it imports nothing
but the standard library, onnx and onnxruntime. Checked with the tools/ package's ruff and mypy
rules (tools/check.sh).
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
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
except ImportError as error:
    sys.stderr.write(
        "int8 quantization runs ONNX Runtime's Python quantizer: install onnxruntime and onnx "
        f"(scripts/setup.sh installs onnxruntime==1.31.1 onnx==1.23.2) ({error})\n"
    )
    sys.exit(3)

OP_TYPES = ["MatMul"]


def fail(message: str) -> NoReturn:
    sys.stderr.write(message + "\n")
    sys.exit(2)


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in graph.node for output in node.output}


def initializers(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {tensor.name: tensor for tensor in graph.initializer}


def weight_matmuls(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """MatMuls whose B is a stored matrix: what the quantizer turns into MatMulInteger."""
    stored = initializers(graph)
    return [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in stored]


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
    name = node.input[1] + ".transposed"
    taken = {v for n in graph.node for v in list(n.input) + list(n.output)} | set(stored)
    while name in taken:
        name += "_"
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table.T), name))
    node.op_type = "MatMul"
    node.input[1] = name
    del node.attribute[:]
    # The table stays: the embedding lookup still reads it.
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--logits", default="logits", help="graph output of the vocabulary scores")
    args = parser.parse_args()

    model = onnx.load(args.input)
    graph = model.graph
    untied = untie_logits(graph, args.logits)
    expected = len(weight_matmuls(graph))

    directory = os.path.dirname(os.path.abspath(args.output))
    handle, temporary = tempfile.mkstemp(suffix=".onnx", dir=directory)
    os.close(handle)
    # mkstemp makes the file private; the package's other files follow the umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    try:
        quantize_dynamic(
            model,
            temporary,
            op_types_to_quantize=OP_TYPES,
            per_channel=True,
            reduce_range=True,
            weight_type=QuantType.QInt8,
        )
        quantized = onnx.load(temporary)
        integer = sum(n.op_type == "MatMulInteger" for n in quantized.graph.node)
        left = [n.name for n in weight_matmuls(quantized.graph)]
        if left or integer != expected:
            fail(f"{expected} weight MatMuls, {integer} quantized; still float: {left}")
        onnx.checker.check_model(quantized, full_check=True)
        os.replace(temporary, args.output)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)

    ops: dict[str, int] = {}
    for node in quantized.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    print(
        json.dumps(
            {
                "op_types": OP_TYPES,
                "onnxruntime": onnxruntime.__version__,
                "onnx": onnx.__version__,
                "graph": {
                    "weight_matmuls": expected,
                    "matmul_integer": integer,
                    "untied_logits": untied,
                    "op_counts": dict(sorted(ops.items())),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
