"""Length heads on what the translation model reads: fit one, and write its graph.

    python3 length_head.py ENCODER.onnx OUT.onnx WORK.json --features {states,subwords}
        [--vocab-size V] [--ridge L] [--threads N]

Both predict the translation's length in target subwords (EOS not counted) as a sum over the
source's positions (its subwords, EOS included), so both extend to inputs of any length as
the text does, and both are linear, so they are fitted in closed form (ridge regression,
float64 normal equations): no training loop, no seed, the same head from the same data.

- `states`: `sum_t (w . h_t + b) + c` over the encoder's final states `h_t` (the tensor every
  cross-attention key and value projection reads): each source subword's share of the length
  read in context (Yang et al. 2020: no second model). OUT.onnx is ENCODER.onnx with the
  head's nodes and one more output, `predicted_lengths [batch]`; its memory outputs are
  unchanged. The features are the float32 encoder's own states as ONNX Runtime computes them.
  A two-layer per-position MLP trained with Adam did no better on held-out data.
- `subwords`: `sum_t table[id_t] + c`, a learned target length per source subword: no
  encoder pass. OUT.onnx is a graph of its own with the encoder's inputs (`source_ids`,
  `source_mask`) and `predicted_lengths`.

WORK.json, written by `nmt-export length-predictor`, holds the encoder inputs (subword ids,
EOS appended, as the engine feeds them) of the training sources with their target lengths,
and of each evaluation split's sources. The script then runs OUT.onnx on every evaluation
split and prints a JSON report on stdout: the head, what it was fitted on, the graph's
predictions per split (what the manifest's measures are computed from), and the largest gap
between the graph and the numpy fit (a check of the written nodes).

`nmt-export length-predictor` carries this file (include_str!) and runs it with `python3 -c`,
so it imports nothing but the standard library, numpy, onnx and onnxruntime. Checked with
the tools/ package's ruff and mypy rules (tools/check.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OUTPUT = "predicted_lengths"
SOURCE_IDS = "source_ids"
SOURCE_MASK = "source_mask"
MEMORY_PREFIX = "memory.cross_key."
# Padded tokens (rows x longest) per encoder run while extracting.
BATCH_TOKENS = 4096


def final_states(model: onnx.ModelProto) -> str:
    """The tensor every cross-attention key projection reads: the encoder's output states.

    Walks back from each `memory.cross_key.*` output through shape-only nodes (Identity,
    Transpose, Reshape, Add of a bias) to the MatMul against a stored matrix, and takes that
    MatMul's activation input; every layer's must be the same tensor.
    """
    producer = {out: node for node in model.graph.node for out in node.output}
    stored = {init.name for init in model.graph.initializer}
    found: set[str] = set()
    for output in model.graph.output:
        if not output.name.startswith(MEMORY_PREFIX):
            continue
        name = output.name
        while True:
            node = producer.get(name)
            if node is None:
                raise SystemExit(f"cannot trace {output.name} back to a projection")
            if node.op_type == "MatMul" and node.input[1] in stored:
                found.add(node.input[0])
                break
            if node.op_type not in ("Identity", "Transpose", "Reshape", "Add"):
                raise SystemExit(
                    f"{output.name} comes from a {node.op_type} node, not a float32 "
                    "projection: fit the head on the float32 package, then quantize"
                )
            name = next(i for i in node.input if i not in stored and i in producer)
    if len(found) != 1:
        raise SystemExit(f"the key projections read {sorted(found) or 'nothing'}, not one tensor")
    return found.pop()


def batches(rows: list[list[int]]) -> list[list[int]]:
    """Row indices, shortest first, in runs of at most BATCH_TOKENS padded tokens."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    runs: list[list[int]] = []
    for i in order:
        if runs and (len(runs[-1]) + 1) * len(rows[i]) <= BATCH_TOKENS:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def padded(rows: list[list[int]], run: list[int]) -> tuple[np.ndarray, np.ndarray]:
    longest = max(len(rows[i]) for i in run)
    ids = np.zeros((len(run), longest), np.int64)
    mask = np.zeros((len(run), longest), np.float32)
    for r, i in enumerate(run):
        ids[r, : len(rows[i])] = rows[i]
        mask[r, : len(rows[i])] = 1.0
    return ids, mask


def summed_states(session: ort.InferenceSession, states: str, rows: list[list[int]]) -> np.ndarray:
    """`[rows, d + 2]`: each source's states summed over its positions, its position count, 1."""
    out: np.ndarray | None = None
    done, last = 0, time.monotonic()
    for run in batches(rows):
        ids, mask = padded(rows, run)
        (h,) = session.run([states], {SOURCE_IDS: ids, SOURCE_MASK: mask})
        sums = (h.astype(np.float64) * mask[..., None]).sum(axis=1)
        if out is None:
            out = np.zeros((len(rows), sums.shape[1] + 2))
        out[run, :-2] = sums
        out[run, -2] = mask.sum(axis=1)
        out[run, -1] = 1.0
        done += len(run)
        if time.monotonic() - last > 30:
            print(f"encoder states: {done}/{len(rows)} sources", file=sys.stderr, flush=True)
            last = time.monotonic()
    assert out is not None, "no sources"
    return out


def ridge_solve(gram: np.ndarray, moment: np.ndarray, ridge: float, unpenalized: int) -> np.ndarray:
    """The ridge solution from `X^T X` and `X^T y`, the last `unpenalized` coefficients (the
    biases) free of the L2 penalty."""
    penalty = np.full(gram.shape[0], ridge)
    penalty[-unpenalized:] = 0.0
    return np.asarray(np.linalg.solve(gram + np.diag(penalty), moment))


def add_head(model: onnx.ModelProto, states: str, coefficients: np.ndarray) -> None:
    """Appends `predicted_lengths = ReduceSum((h @ w + b) * mask) + c` to the encoder graph."""
    w = coefficients[:-2].astype(np.float32).reshape(-1, 1)
    b, c = (np.array(v, np.float32) for v in coefficients[-2:])
    g = model.graph
    g.initializer.extend(
        [
            numpy_helper.from_array(w, "length_head.weight"),
            numpy_helper.from_array(b, "length_head.position_bias"),
            numpy_helper.from_array(c, "length_head.bias"),
            numpy_helper.from_array(np.array([2], np.int64), "length_head.last_axis"),
            numpy_helper.from_array(np.array([1], np.int64), "length_head.time_axis"),
        ]
    )
    g.node.extend(
        [
            helper.make_node("MatMul", [states, "length_head.weight"], ["length_head.per_position"]),
            helper.make_node(
                "Squeeze", ["length_head.per_position", "length_head.last_axis"], ["length_head.squeezed"]
            ),
            helper.make_node("Add", ["length_head.squeezed", "length_head.position_bias"], ["length_head.biased"]),
            helper.make_node("Mul", ["length_head.biased", SOURCE_MASK], ["length_head.masked"]),
            helper.make_node(
                "ReduceSum",
                ["length_head.masked", "length_head.time_axis"],
                ["length_head.sum"],
                keepdims=0,
            ),
            helper.make_node("Add", ["length_head.sum", "length_head.bias"], [OUTPUT]),
        ]
    )
    g.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch"]))


def subword_gram(rows: list[list[int]], targets: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """`X^T X` and `X^T y` of the subword counts (one column per id, then the constant),
    accumulated a source at a time: the dense count matrix would not fit in memory."""
    gram = np.zeros((vocab + 1, vocab + 1))
    moment = np.zeros(vocab + 1)
    for row, target in zip(rows, targets, strict=True):
        ids, counts = np.unique(np.asarray(row + [vocab], np.int64), return_counts=True)
        counts = counts.astype(np.float64)
        gram[np.ix_(ids, ids)] += np.outer(counts, counts)
        moment[ids] += counts * target
    return gram, moment


def subword_predictions(rows: list[list[int]], coefficients: np.ndarray) -> np.ndarray:
    table, bias = coefficients[:-1], coefficients[-1]
    return np.array([table[row].sum() + bias for row in rows])


def table_graph(coefficients: np.ndarray) -> onnx.ModelProto:
    """`predicted_lengths = ReduceSum(table[source_ids] * source_mask) + c`."""
    table = coefficients[:-1].astype(np.float32)
    bias = np.array(coefficients[-1], np.float32)
    dims = ["batch", "source_len"]
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["length_head.table", SOURCE_IDS], ["length_head.per_position"], axis=0),
            helper.make_node("Mul", ["length_head.per_position", SOURCE_MASK], ["length_head.masked"]),
            helper.make_node(
                "ReduceSum", ["length_head.masked", "length_head.time_axis"], ["length_head.sum"], keepdims=0
            ),
            helper.make_node("Add", ["length_head.sum", "length_head.bias"], [OUTPUT]),
        ],
        "length_predictor",
        [
            helper.make_tensor_value_info(SOURCE_IDS, TensorProto.INT64, dims),
            helper.make_tensor_value_info(SOURCE_MASK, TensorProto.FLOAT, dims),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch"])],
        [
            numpy_helper.from_array(table, "length_head.table"),
            numpy_helper.from_array(bias, "length_head.bias"),
            numpy_helper.from_array(np.array([1], np.int64), "length_head.time_axis"),
        ],
    )
    graph.doc_string = "target subwords = sum of a learned length per source subword (EOS included), plus c"
    # IR version 8 (ONNX 1.10), which every ONNX Runtime since 1.10 reads; onnx 1.23 would
    # write its own newest, which ONNX Runtime 1.31 refuses.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def graph_predictions(session: ort.InferenceSession, rows: list[list[int]]) -> np.ndarray:
    out = np.zeros(len(rows))
    for run in batches(rows):
        ids, mask = padded(rows, run)
        (p,) = session.run([OUTPUT], {SOURCE_IDS: ids, SOURCE_MASK: mask})
        out[run] = p
    return out


Reference = Callable[[list[list[int]]], np.ndarray]


def states_head(
    args: argparse.Namespace, train: dict[str, Any], options: ort.SessionOptions
) -> tuple[onnx.ModelProto, Reference, dict[str, Any]]:
    """The encoder with the head on its states added, the numpy fit, and what the head is."""
    model = onnx.load(args.encoder)
    if any(o.name == OUTPUT for o in model.graph.output):
        raise SystemExit(f"{args.encoder} already has a {OUTPUT} output")
    states = final_states(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info(states, TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    targets = np.asarray(train["targets"], np.float64)
    features = summed_states(session, states, train["sources"])
    # The state weights are penalized, not b or c.
    coefficients = ridge_solve(features.T @ features, features.T @ targets, args.ridge, 2)
    add_head(model, states, coefficients)

    def reference(sources: list[list[int]]) -> np.ndarray:
        return np.asarray(summed_states(session, states, sources) @ coefficients)

    head = {
        "reads": states,
        "formula": "sum over source positions (EOS included) of (w . h_t + b), plus c",
        "state_dim": int(coefficients.size - 2),
        "position_bias": float(coefficients[-2]),
        "bias": float(coefficients[-1]),
    }
    return model, reference, head


def subwords_head(args: argparse.Namespace, train: dict[str, Any]) -> tuple[onnx.ModelProto, Reference, dict[str, Any]]:
    """The table's graph, the numpy fit, and what the head is."""
    if args.vocab_size <= 0:
        raise SystemExit("--features subwords needs --vocab-size")
    targets = np.asarray(train["targets"], np.float64)
    gram, moment = subword_gram(train["sources"], targets, args.vocab_size)
    coefficients = ridge_solve(gram, moment, args.ridge, 1)

    def reference(sources: list[list[int]]) -> np.ndarray:
        return subword_predictions(sources, coefficients)

    head = {
        "reads": "source subword ids (EOS included)",
        "formula": "sum over source positions (EOS included) of table[id], plus c",
        "vocab_size": args.vocab_size,
        "bias": float(coefficients[-1]),
    }
    return table_graph(coefficients), reference, head


def evaluate(
    graph: ort.InferenceSession, reference: Reference, splits: dict[str, list[list[int]]]
) -> tuple[dict[str, list[float]], float, float]:
    """The graph's predictions per split, its largest gap to the numpy fit, and its seconds
    per source."""
    predictions: dict[str, list[float]] = {}
    largest_gap = 0.0
    graph_seconds, evaluated = 0.0, 0
    for split, sources in splits.items():
        started = time.monotonic()
        from_graph = graph_predictions(graph, sources)
        graph_seconds += time.monotonic() - started
        gap = np.abs(from_graph - reference(sources))
        largest_gap = max(largest_gap, float(np.max(gap, initial=0.0)))
        predictions[split] = [round(float(p), 4) for p in from_graph]
        evaluated += len(sources)
    if largest_gap > 1e-2:
        raise SystemExit(f"the written head differs from the fit by {largest_gap}")
    return predictions, largest_gap, graph_seconds / max(evaluated, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("encoder", help="the package's float32 encoder.onnx")
    parser.add_argument("out", help="where the graph with the head is written")
    parser.add_argument("work", help="sources and target lengths (see the module docstring)")
    parser.add_argument("--features", choices=["states", "subwords"], required=True, help="what the head reads")
    parser.add_argument("--vocab-size", type=int, default=0, help="the tokenizer's size (subwords)")
    parser.add_argument("--ridge", type=float, default=1.0, help="L2 penalty on the weights (not the constant)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    args = parser.parse_args()

    with open(args.work, encoding="utf-8") as file:
        work: dict[str, Any] = json.load(file)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    started = time.monotonic()
    if args.features == "states":
        model, reference, head = states_head(args, work["train"], options)
    else:
        model, reference, head = subwords_head(args, work["train"])
    fit_seconds = time.monotonic() - started
    onnx.checker.check_model(model)
    onnx.save(model, args.out)
    graph = ort.InferenceSession(args.out, options, providers=["CPUExecutionProvider"])
    predictions, largest_gap, seconds_per_source = evaluate(graph, reference, work["splits"])
    json.dump(
        {
            "head": head | {"features": args.features, "ridge": args.ridge},
            "fitted_on": {
                "sources": len(work["train"]["sources"]),
                "seconds": round(fit_seconds, 1),
                "threads": args.threads,
            },
            "graph_minus_numpy_max": largest_gap,
            "graph_seconds_per_source": seconds_per_source,
            "predictions": predictions,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
