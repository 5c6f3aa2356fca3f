"""Where a decoder step's time goes at batch 1: the step as greedy decoding runs it, against
what the same ONNX Runtime build cannot go below.

For a float32 package and its int8 twin, in one run with the cells interleaved (round 1 in
order, round 2 reversed, ...), on one intra-op thread:

- step: the package's decoder in greedy decoding of the first --verses test verses at batch 1
  (the encoder once per verse, the cache grown by concatenation as the graph's contract asks;
  the step's own `run` is timed), in ms per step;
- projections: every matrix product of the decoder with a constant weight (the layers' linear
  projections, Shaw's relative value table, the output projection), taken with the package's
  own weights into a graph of those products alone, each fed a fresh [1, K] input; for int8,
  that graph quantized by `nmt-export quantize`'s own script (model-export/python/quantize.py:
  int8 weights per channel, 8-bit on a CPU with VNNI and 7-bit elsewhere, activations per
  row); in µs per run;
- dispatch: a chain of as many one-row elementwise nodes as ONNX Runtime runs in the optimized
  step (Add, Mul, Sub on [1, d_model]), in µs per run: what the node count alone costs;
- empty run: a graph that takes the step's inputs at the shapes of a mid-verse step and
  returns its outputs by Identity, in µs per run: the cost of a `run` call with this many
  tensors (from Python; the server's Rust binding pays less per tensor).

The projections and the dispatch floor are what graph-level work (fused attention, fewer
nodes) cannot remove; the rest of a step is attention over the cache and the source, layer
norms, the Shaw gathers and their nodes' dispatch.

    python3 -m nmt_tools.decoding.step_floor --package runs/pkg-plain --int8-package runs/pkg-plain-int8

Needs onnxruntime, onnx, numpy (scripts/setup.sh installs them) and tokenizers
(`pip install -e 'tools[tokenizers]'`). Prints Markdown; --out-json keeps the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_tools.machine import cpu_model, isa_flags
from nmt_tools.paths import repo_root
from nmt_tools.provenance import short_commit, version

if TYPE_CHECKING:
    import numpy.typing as npt
    import onnx

    Feeds = dict[str, npt.NDArray[Any]]

MODULE = "nmt_tools.decoding.step_floor"
IR_VERSION = 9  # what ONNX Runtime 1.31 reads
OPSET = 17

# An ONNX Runtime InferenceSession (the package has no type information).
Session = Any


# ONNX Runtime's threading layouts --threading times the step under: a name, intra-op
# threads, and session config entries (onnxruntime_session_options_config_keys.h). Affinities
# name the logical processors (from 1) of the pool's threads beyond the caller's.
THREADING: list[tuple[str, int, dict[str, str]]] = [
    ("2 threads, defaults (spinning)", 2, {}),
    ("2 threads, no spinning", 2, {"session.intra_op.allow_spinning": "0"}),
    ("2 threads, dynamic block base 4", 2, {"session.dynamic_block_base": "4"}),
    (
        "2 threads, no spinning, dynamic block base 4",
        2,
        {"session.intra_op.allow_spinning": "0", "session.dynamic_block_base": "4"},
    ),
    ("2 threads, pool thread pinned to the second CPU", 2, {"session.intra_op_thread_affinities": "2"}),
    (
        "2 threads, no spinning, pool thread pinned",
        2,
        {"session.intra_op.allow_spinning": "0", "session.intra_op_thread_affinities": "2"},
    ),
]


def session(
    model: str | onnx.ModelProto,
    optimized_path: str | None = None,
    threads: int = 1,
    entries: dict[str, str] | None = None,
) -> Session:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in (entries or {}).items():
        options.add_session_config_entry(key, value)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def time_runs(sess: Session, feeds: Feeds, runs: int) -> float:
    """µs per `run` of `sess`, after a tenth as many untimed runs."""
    for _ in range(runs // 10):
        sess.run(None, feeds)
    start = time.perf_counter()
    for _ in range(runs):
        sess.run(None, feeds)
    return (time.perf_counter() - start) / runs * 1e6


def make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    from onnx import helper

    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


class Step:
    """Greedy decoding of the test verses through a package's graphs at batch 1."""

    def __init__(
        self, package: str, verses: list[str], work: str, threads: int = 1, entries: dict[str, str] | None = None
    ) -> None:
        import onnx
        from tokenizers import Tokenizer

        self.manifest: dict[str, Any] = json.loads(Path(package, "manifest.json").read_text())
        self.tokenizer = Tokenizer.from_file(os.path.join(package, "tokenizer.json"))
        self.encoder = session(os.path.join(package, "encoder.onnx"))
        optimized = os.path.join(work, os.path.basename(package.rstrip("/")) + ".decoder.opt.onnx")
        self.decoder = session(os.path.join(package, "decoder.onnx"), optimized, threads, entries)
        self.optimized_nodes = len(onnx.load(optimized).graph.node)
        self.verses = verses
        self.inputs = {i.name for i in self.decoder.get_inputs()}
        self.outputs = [o.name for o in self.decoder.get_outputs()]

    def feeds(self, ids: list[int], memory: Feeds, past: Feeds, token: int, position: int) -> Feeds:
        import numpy as np

        feeds = {
            "target_ids": np.array([token], np.int64),
            "positions": np.array([position], np.int64),
            "target_lengths": np.array([len(ids)], np.int64),
            **memory,
            **past,
        }
        return {k: v for k, v in feeds.items() if k in self.inputs}

    def empty_state(self) -> Feeds:
        """Every `past.*` input with no time steps yet."""
        import numpy as np

        past = {}
        for name in self.inputs:
            if name.startswith("past."):
                shape = [d if isinstance(d, int) else 0 for d in self.decoder_input(name).shape]
                shape[0] = 1
                past[name] = np.zeros(shape, np.float32)
        return past

    def decode(self, line: str, record: list[Feeds] | None = None) -> tuple[int, float]:
        """Decodes one verse; returns (steps, seconds in the decoder's run)."""
        import numpy as np

        m = self.manifest
        ids = self.tokenizer.encode(line).ids + [m["eos_id"]]
        source = np.array([ids], np.int64)
        outputs = self.encoder.run(None, {"source_ids": source, "source_mask": np.ones_like(source, np.float32)})
        memory = dict(zip([o.name for o in self.encoder.get_outputs()], outputs, strict=True))
        past = self.empty_state()
        token, seconds, steps = m["bos_id"], 0.0, 0
        for position in range(2 * len(ids) + 10):
            feeds = self.feeds(ids, memory, past, token, position)
            if record is not None and position == len(ids) // 2:
                record.append(feeds)
            start = time.perf_counter()
            out = dict(zip(self.outputs, self.decoder.run(None, feeds), strict=True))
            seconds += time.perf_counter() - start
            steps += 1
            for name in past:
                present = out["present." + name[len("past.") :]]
                past[name] = np.concatenate([past[name], present], axis=2)
            token = int(out["logits"][0].argmax())
            if token == m["eos_id"]:
                break
        return steps, seconds

    def decoder_input(self, name: str) -> Any:  # noqa: ANN401 (onnxruntime's NodeArg)
        return next(i for i in self.decoder.get_inputs() if i.name == name)

    def ms_per_step(self) -> float:
        steps, seconds = 0, 0.0
        for line in self.verses:
            s, t = self.decode(line)
            steps, seconds = steps + s, seconds + t
        return seconds / steps * 1e3

    def empty_run_graph(self) -> tuple[onnx.ModelProto, Feeds]:
        """The step's inputs and outputs at a mid-verse step's shapes, joined by Identity."""
        import numpy as np
        from onnx import TensorProto, helper

        recorded: list[Feeds] = []
        self.decode(self.verses[0], recorded)
        feeds = recorded[0]
        graph_inputs: list[onnx.ValueInfoProto] = []
        graph_outputs: list[onnx.ValueInfoProto] = []
        nodes: list[onnx.NodeProto] = []
        elem = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float32): TensorProto.FLOAT}
        for name, value in feeds.items():
            graph_inputs.append(helper.make_tensor_value_info(name, elem[value.dtype], value.shape))
        for out in self.decoder.get_outputs():
            source = "positions" if out.name == "logits" else out.name.replace("present.", "past.")
            if source not in feeds:
                source = next(iter(feeds))
            nodes.append(helper.make_node("Identity", [source], [out.name]))
            graph_outputs.append(helper.make_tensor_value_info(out.name, elem[feeds[source].dtype], None))
        return make_model(helper.make_graph(nodes, "empty", graph_inputs, graph_outputs)), feeds


def projections_graph(package: str) -> tuple[onnx.ModelProto, Feeds, int, int]:
    """Every MatMul/Gemm of the float32 decoder with a constant 2-D weight, each fed its own
    [1, K] input (Gemm with transB reads its weight transposed, as the tied output projection
    does); with its feeds, its number of products and of weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(os.path.join(package, "decoder.onnx"))
    weights = {t.name: t for t in model.graph.initializer}
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        w = weights.get(node.input[1])
        if w is None or len(w.dims) != 2:
            continue
        array = numpy_helper.to_array(w)
        if any(a.name == "transB" and a.i == 1 for a in node.attribute):
            array = array.T.copy()
        k, n = array.shape
        i = len(nodes)
        initializers.append(numpy_helper.from_array(array.astype(np.float32), f"w{i}"))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, k]))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, n]))
    graph = helper.make_graph(nodes, "projections", inputs, outputs, initializers)
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in inputs
    }
    macs = sum(int(np.prod(list(t.dims))) for t in initializers)
    return make_model(graph), feeds, len(nodes), macs


def quantized(model: onnx.ModelProto, work: str) -> onnx.ModelProto:
    """The graph as `nmt-export quantize` rewrites a package's graphs, with the weight range
    it picks for this CPU."""
    import onnx

    source = os.path.join(work, "projections.onnx")
    target = os.path.join(work, "projections.int8.onnx")
    onnx.save(model, source)
    vnni = {"avx512_vnni", "avx_vnni"} & set(isa_flags())
    bits = "8" if vnni or platform.machine() not in ("x86_64", "AMD64", "i686") else "7"
    script = repo_root() / "model-export" / "python" / "quantize.py"
    command = [sys.executable, str(script), source, target, "--weight-bits", bits]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return onnx.load(target)


def nbits(model: onnx.ModelProto, bits: int, block_size: int) -> onnx.ModelProto:
    """The projections as `MatMulNBits` (weight-only, blockwise), integer compute (accuracy
    level 4). Needs the onnx_ir package (PyPI) beside onnxruntime."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4, bits=bits)
    quantizer = MatMulNBitsQuantizer(onnx.load_from_string(model.SerializeToString()), algo_config=config)
    quantizer.process()
    result: onnx.ModelProto = quantizer.model.model
    return result


def dispatch_chain(nodes: int, width: int) -> tuple[onnx.ModelProto, Feeds]:
    import numpy as np
    from onnx import TensorProto, helper

    ops = ["Add", "Mul", "Sub"]
    chain, x = [], "x"
    for i in range(nodes):
        chain.append(helper.make_node(ops[i % 3], [x, "x"], [f"h{i}"]))
        x = f"h{i}"
    graph = helper.make_graph(
        chain,
        "dispatch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
    )
    return make_model(graph), {"x": np.full((1, width), 0.5, np.float32)}


# A cell's name and what one measurement of it returns (µs).
Cells = dict[str, Callable[[], float]]


def build_cells(args: argparse.Namespace, steps: dict[str, Step], work: str) -> tuple[Cells, dict[str, Any]]:
    """Every cell to time, in order, and what the report says about the projections."""
    config = steps["float32"].manifest["config"]
    proj_model, proj_feeds, proj_count, macs = projections_graph(args.package)
    proj = {"float32": session(proj_model)}
    if "int8" in steps:
        proj["int8"] = session(quantized(proj_model, work))

    def timed(sess: Session, feeds: Feeds) -> Callable[[], float]:
        return lambda: time_runs(sess, feeds, args.runs)

    def step_us(step: Step) -> Callable[[], float]:
        return lambda: step.ms_per_step() * 1e3

    cells: Cells = {}
    if args.nbits:
        for bits in (8, 4):
            cells[f"projections MatMulNBits {bits}-bit"] = timed(session(nbits(proj_model, bits, 32)), proj_feeds)
    for precision, step in steps.items():
        cells[f"step {precision}"] = step_us(step)
        cells[f"projections {precision}"] = timed(proj[precision], proj_feeds)
        chain, feeds = dispatch_chain(step.optimized_nodes, config["d_model"])
        cells[f"dispatch {precision} ({step.optimized_nodes} nodes)"] = timed(session(chain), feeds)
    empty_model, empty_feeds = steps["float32"].empty_run_graph()
    cells["empty run"] = timed(session(empty_model), empty_feeds)
    if args.threading:
        for precision, step in steps.items():
            package = args.package if precision == "float32" else args.int8_package
            for name, threads, entries in THREADING:
                threaded = Step(package, step.verses, work, threads, entries)
                cells[f"step {precision}, {name}"] = step_us(threaded)
    return cells, {"count": proj_count, "macs": macs}


def interleaved(cells: Cells, rounds: int) -> dict[str, list[float]]:
    """Each cell once per round, in order, then in reverse order (ABBA...)."""
    results: dict[str, list[float]] = {name: [] for name in cells}
    order = list(cells)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            results[name].append(cells[name]())
    return results


def markdown(
    args: argparse.Namespace, config: dict[str, Any], projections: dict[str, Any], results: dict[str, list[float]]
) -> list[str]:
    medians = {name: statistics.median(v) for name, v in results.items()}
    lines = [
        "# Decoder step at batch 1 against its floors\n",
        f"- command: `python3 -m {MODULE} {' '.join(sys.argv[1:])}`",
        f"- CPU: {cpu_model()} ({', '.join(isa_flags())}), {os.cpu_count()} cores; ONNX Runtime "
        f"{version('onnxruntime')}, one intra-op thread unless a cell says otherwise; git {short_commit()}",
        f"- model: {config['preset']}, d_model {config['d_model']}, {config['decoder_layers']} decoder layers, "
        f"vocabulary {config['vocab_size']}",
        f"- projections: {projections['count']} matrix products, {projections['macs'] / 1e6:.2f} M weights; "
        f"{args.verses} verses per step cell; {args.rounds} interleaved rounds, medians [min-max]\n",
        "| cell | median | min | max |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, v in results.items():
        lines.append(f"| {name} | {medians[name]:.1f} us | {min(v):.1f} | {max(v):.1f} |")
    for precision in ("float32", "int8"):
        if f"step {precision}" not in medians:
            continue
        step_us = medians[f"step {precision}"]
        floor = medians[f"projections {precision}"]
        dispatch = next(medians[n] for n in results if n.startswith(f"dispatch {precision}"))
        lines.append(
            f"\n{precision}: projections {floor / step_us:.0%} of the step, node dispatch "
            f"{dispatch / step_us:.0%}, the rest {(step_us - floor - dispatch) / step_us:.0%} "
            f"({step_us - floor - dispatch:.0f} µs)."
        )
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--package", required=True, help="float32 model package")
    p.add_argument("--int8-package", help="its int8 twin (nmt-export quantize)")
    p.add_argument("--verses", type=int, default=60, help="test verses decoded per step cell")
    p.add_argument("--source", default="data/corpus/test.en", help="the verses, one per line")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    p.add_argument("--runs", type=int, default=2000, help="runs per floor cell and round")
    p.add_argument(
        "--nbits",
        action="store_true",
        help="also time the projections as MatMulNBits (8-bit and 4-bit weights, blocks of 32, accuracy level 4; "
        "needs onnx_ir)",
    )
    p.add_argument(
        "--threading",
        action="store_true",
        help="also time the step with 2 intra-op threads under ONNX Runtime's threading options "
        "(spinning, dynamic block base, the pool thread's affinity)",
    )
    p.add_argument("--out-json", help="also write the numbers here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    verses = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.verses]
    packages = {"float32": args.package} | ({"int8": args.int8_package} if args.int8_package else {})
    with tempfile.TemporaryDirectory(prefix="step-floor-") as work:
        steps = {k: Step(v, verses, work) for k, v in packages.items()}
        cells, projections = build_cells(args, steps, work)
        results = interleaved(cells, args.rounds)
    config = steps["float32"].manifest["config"]
    print("\n".join(markdown(args, config, projections, results)))
    if args.out_json:
        medians = {name: statistics.median(v) for name, v in results.items()}
        document = {"argv": sys.argv, "cpu": cpu_model(), "results": results, "medians": medians}
        Path(args.out_json).write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
