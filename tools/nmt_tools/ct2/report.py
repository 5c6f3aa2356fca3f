"""compare's report: the figures of each cell, the ratios against CTranslate2, the agreement
of the outputs, and the Markdown page made of them (also from a saved JSON: `--render`)."""

from __future__ import annotations

import statistics
from typing import Any

from nmt_tools.ct2.cells import CT2, ENGINE, SERVER
from nmt_tools.machine import busy_summary

Report = dict[str, Any]

MODES = ["one", "concurrent", "batch"]
MODE_TITLES = {
    "one": "1 at a time",
    "concurrent": "{clients} concurrent",
    "batch": "batches of {batch}",
}


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell's passes: target subwords per second, median and range; sentences per second
    (median); the largest peak resident memory any pass reported."""
    rates = [p["output_tokens"] / p["seconds"] for p in passes]
    peaks = [p["peak_rss_mib"] for p in passes if p.get("peak_rss_mib") is not None]
    return {
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "sentences_per_second": statistics.median(p["sentences"] / p["seconds"] for p in passes),
        "peak_rss_mib": max(peaks) if peaks else None,
        "tokens_per_second": rates,
        "output_tokens": [p["output_tokens"] for p in passes],
        "seconds": [p["seconds"] for p in passes],
        "hit_budget": [p.get("hit_budget") for p in passes],
    }


def agreement(reference: list[str], other: list[str]) -> dict[str, Any]:
    """Identical lines of `other` against `reference`, and the indices of those that differ."""
    same = [i for i, (a, b) in enumerate(zip(reference, other, strict=False)) if a == b]
    differ = [i for i in range(len(reference)) if i >= len(other) or reference[i] != other[i]]
    return {"agree": len(same), "of": len(reference), "differ": differ}


def ratios(report: Report) -> list[dict[str, Any]]:
    """This side's median over CTranslate2's best median of the same precision: in the same
    mode, and over all modes."""
    cells = [c for c in report["cells"] if "result" in c and not c.get("reference")]
    out = []
    for precision in ("float32", "int8"):
        ct2 = [c for c in cells if c["system"] == CT2 and c["precision"] == precision]
        ours = [c for c in cells if c["system"] != CT2 and c["precision"] == precision]
        if not ct2 or not ours:
            continue
        best_any = max(ct2, key=lambda c: c["result"]["median"])
        for c in ours:
            same = [d for d in ct2 if d["mode"] == c["mode"]]
            best_same = max(same, key=lambda d: d["result"]["median"]) if same else None
            out.append(
                {
                    "precision": precision,
                    "cell": c["id"],
                    "system": c["system"],
                    "mode": c["mode"],
                    "threads": c["threads"],
                    "median": c["result"]["median"],
                    "ct2_best_same_mode": best_same and best_same["id"],
                    "ratio_same_mode": best_same and c["result"]["median"] / best_same["result"]["median"],
                    "ct2_best": best_any["id"],
                    "ratio_best": c["result"]["median"] / best_any["result"]["median"],
                }
            )
    return out


# The goal's comparisons: this server (HTTP) in a mode against CTranslate2's best median of the
# same precision over these modes.
GOALS = {"one": ("one",), "concurrent": ("concurrent", "batch")}


def goal_ratios(report: Report) -> list[dict[str, Any]]:
    """This server's best median over CTranslate2's best, per precision: one client against
    CTranslate2 one sentence at a time; many clients against CTranslate2 at its fastest with
    many sentences, its own batching included."""
    cells = [c for c in report["cells"] if "result" in c and not c.get("reference")]
    out = []
    for precision in ("float32", "int8"):
        for mode, ct2_modes in GOALS.items():
            ours = [c for c in cells if c["system"] == SERVER and c["precision"] == precision and c["mode"] == mode]
            ct2 = [c for c in cells if c["system"] == CT2 and c["precision"] == precision and c["mode"] in ct2_modes]
            if not ours or not ct2:
                continue
            best = max(ours, key=lambda c: c["result"]["median"])
            theirs = max(ct2, key=lambda c: c["result"]["median"])
            out.append(
                {
                    "precision": precision,
                    "mode": mode,
                    "cell": best["id"],
                    "median": best["result"]["median"],
                    "ct2_cell": theirs["id"],
                    "ct2_median": theirs["result"]["median"],
                    "ratio": best["result"]["median"] / theirs["result"]["median"],
                    "sentences_ratio": best["result"]["sentences_per_second"]
                    / theirs["result"]["sentences_per_second"],
                }
            )
    return out


def fmt(s: dict[str, Any] | None) -> str:
    return f"{s['median']:.0f} [{s['min']:.0f}-{s['max']:.0f}]" if s else "-"


def batch_sizes(report: Report) -> list[int]:
    """The run's batch sizes (a run before sizes were swept has one, `batch_size`)."""
    return report.get("batch_sizes") or [report["batch_size"]]


def sizes_text(report: Report) -> str:
    """`32`, or `8, 16 and 32`."""
    sizes = [str(b) for b in batch_sizes(report)]
    return sizes[0] if len(sizes) == 1 else ", ".join(sizes[:-1]) + " and " + sizes[-1]


def mode_title(mode: str, report: Report) -> str:
    if mode == "batch" and len(batch_sizes(report)) > 1:
        return "sorted batches"
    return MODE_TITLES[mode].format(clients=report["clients"], batch=batch_sizes(report)[0])


def header(r: Report) -> list[str]:
    """The run's provenance: when, how, on what, with which versions."""
    policy = r["ct2_omp_wait_policy"]
    machine = r["machine"]
    isa = f" ({', '.join(machine['isa'])})" if machine.get("isa") else ""
    int8 = r["int8"]
    lines = [
        "# This server against CTranslate2, same weights",
        "",
        "Written by `python3 -m nmt_tools.ct2.compare` (`--help` says how it works).",
        "",
        f"- date: {r['date']}",
        f"- command: `{r['command']}`",
        f"- git: {r['git']['commit']}" + (" (working tree with uncommitted changes)" if r["git"]["dirty"] else ""),
        f"- CPU: {machine['cpu']}{isa}, {machine['nproc']} cores; load average at start "
        f"{machine['loadavg_start']}, at end {machine['loadavg_end']}",
        f"- versions: CTranslate2 {r['versions']['ctranslate2']} ({r['ct2_backend']}; "
        + (f"`OMP_WAIT_POLICY={policy}`" if policy else "libgomp's default wait policy")
        + f"), ONNX Runtime {r['versions']['onnxruntime']}, tokenizers (Python) "
        f"{r['versions']['tokenizers']}",
        f"- model: `{r['package']['path']}` ({r['package']['name']}, preset "
        f"`{r['package']['preset']}`), "
        + (
            f"imported from `{r['package']['hf_dir']}`, which CTranslate2 converts with its own "
            "`TransformersConverter` (`add_source_eos` set, as Marian's tokenizer appends it); "
            if r["package"].get("hf_dir")
            else "converted by `nmt_tools.ct2.convert`; "
        )
        + 'CTranslate2\'s int8 is `compute_type="int8"` on that float32 model (weights '
        "quantized when it loads); this side's int8: "
        + (f"`{int8['package']}` from {int8['how']}" if int8["package"] else int8["how"]),
        f"- inputs: `{r['verses']}` ({r['sentences']} verses); a pass translates each once; "
        f"{r['passes']} passes per cell, interleaved (round 1 runs every cell once in the order "
        "of the table, round 2 in reverse, ...); every worker translated "
        f"{r['warmup']} verses before its first pass",
        f"- wall time of the run: {r['wall_seconds'] / 60:.1f} min",
    ]
    if machine["busy_start"]:
        lines.append(f"- also running at the start: {busy_summary(machine['busy_start'])}")
    return lines


def modes_explained(r: Report) -> list[str]:
    lines = [
        "",
        "Every cell decodes greedily with nmt-server's output budget, ceil("
        f"{r['limits']['NMT_MAX_LENGTH_RATIO']} x source subwords) + "
        f"{r['limits']['NMT_MAX_LENGTH_OFFSET']}, and counts target subwords (EOS not counted) "
        "over the pass's wall time, tokenization and detokenization included:",
        "",
        "- 1 at a time: CTranslate2 `translate_batch` with one sentence per call, one call after "
        "the other; this engine with batch size 1; this server with one closed-loop HTTP client.",
        f"- {r['clients']} concurrent: CTranslate2 from {r['clients']} Python threads, each "
        "calling `translate_batch` with one sentence as soon as its previous one is back "
        "(CTranslate2 does not batch separate calls: they queue for its `inter_threads` "
        f"replicas); this server with {r['clients']} closed-loop HTTP clients (continuous "
        "batching, its default).",
        f"- {mode_title('batch', r)}: the whole set sorted longest first and cut into "
        f"batches of {sizes_text(r)}"
        + (" (each size a row of its own)" if len(batch_sizes(r)) > 1 else "")
        + ", the same batches on both sides (this engine's own "
        "order, as nmt-eval and nmt-translate run it); CTranslate2 decodes a batch up to its "
        "longest budget and each output is cut to its own budget, where this engine stops. "
        "With `inter_threads` 2, two Python threads hand CTranslate2 the batches, so that both "
        "replicas decode one at a time (its batching on both cores).",
    ]
    if r.get("reference_package"):
        lines.append(
            f"- shipped model: `{r['reference_package']}` through this engine, as a request "
            "without `target_length` gets it: its length predictor (BERT) plans every "
            "sentence's length before decoding. CTranslate2 cannot express its length-aware "
            "decoder."
        )
    return lines


def throughput_table(r: Report) -> list[str]:
    lines = [
        "",
        "Target subwords per second, median [min-max] of the passes:",
        "",
        "| system | precision | threads | " + " | ".join(mode_title(m, r) for m in MODES) + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in MODES) + " |",
    ]
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in r["cells"]:
        key = (c["system"], c["precision"], c["threads"])
        rows.setdefault(key, {})[c["mode"]] = c.get("result")
    # By precision, then CTranslate2's rows before this side's (cells run in another order).
    systems = [CT2, ENGINE, SERVER]
    first_seen = {key: i for i, key in enumerate(rows)}

    def row_order(key: tuple[str, str, str]) -> tuple[bool, bool, int, int]:
        system, precision, _ = key
        rank = systems.index(system) if system in systems else len(systems)
        return (rank == len(systems), precision != "float32", rank, first_seen[key])

    for key in sorted(rows, key=row_order):
        system, precision, threads = key
        by_mode = rows[key]
        lines.append(
            f"| {system} | {precision} | {threads} | "
            + " | ".join(fmt(by_mode.get(m)) if m in by_mode else "" for m in MODES)
            + " |"
        )
    failed = [c for c in r["cells"] if "failure" in c]
    if failed:
        lines += ["", "Cells that failed:", ""]
        lines += [f"- {c['id']}: {c['failure']}" for c in failed]
    return lines


def per_cell_table(r: Report) -> list[str]:
    """Sentences per second and peak memory beside each cell's subwords per second."""
    lines = [
        "",
        "Every cell: target subwords and sentences per second (medians) and the peak resident "
        "memory of the process that translates (CTranslate2's worker, Python included; this "
        "engine's worker; the server for HTTP cells):",
        "",
        "| cell | system | precision | threads | mode | tok/s | sentences/s | peak RSS (MiB) |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for c in r["cells"]:
        res = c.get("result")
        if not res:
            continue
        rss = f"{res['peak_rss_mib']:.0f}" if res.get("peak_rss_mib") is not None else "-"
        sentences = res.get("sentences_per_second")
        lines.append(
            f"| `{c['id']}` | {c['system']} | {c['precision']} | {c['threads']} | "
            f"{mode_title(c['mode'], r)} | {res['median']:.0f} | "
            + (f"{sentences:.1f}" if sentences is not None else "-")
            + f" | {rss} |"
        )
    return lines


def goal_table(r: Report) -> list[str]:
    rows = r.get("goal_ratios") or []
    if not rows:
        return []
    lines = [
        "",
        "The goal's comparison: this server's best layout against CTranslate2's best setting of "
        "the same precision, 1 client against one sentence at a time, "
        f"{r['clients']} clients against CTranslate2's best with many sentences (its "
        f"{r['clients']} threads or its own batches of {sizes_text(r)}, on both cores):",
        "",
        "| precision | clients | this server | tok/s | CTranslate2 | tok/s | ratio (tok/s) | ratio (sentences/s) |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for x in rows:
        clients = "1" if x["mode"] == "one" else str(r["clients"])
        lines.append(
            f"| {x['precision']} | {clients} | `{x['cell']}` | {x['median']:.0f} | `{x['ct2_cell']}` | "
            f"{x['ct2_median']:.0f} | {x['ratio']:.2f} | {x['sentences_ratio']:.2f} |"
        )
    return lines


def ratio_table(r: Report) -> list[str]:
    lines = [
        "",
        "This side's median over CTranslate2's best median of the same precision, in the same "
        "column and in any column:",
        "",
        "| precision | system | threads | mode | tok/s | / CT2 best, same column | / CT2 best, any column |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for x in r["ratios"]:
        same = f"{x['ratio_same_mode']:.2f} (`{x['ct2_best_same_mode']}`)" if x["ratio_same_mode"] else "-"
        lines.append(
            f"| {x['precision']} | {x['system']} | {x['threads']} | {mode_title(x['mode'], r)} | "
            f"{x['median']:.0f} | {same} | {x['ratio_best']:.2f} (`{x['ct2_best']}`) |"
        )
    return lines


def agreement_table(r: Report) -> list[str]:
    refs = r["agreement_references"]
    lines = [
        "",
        f"Agreement: identical output lines (of {r['sentences']}) between each cell's first "
        "pass and this engine's greedy outputs at batch 1, float32 (`"
        + refs.get("float32", "-")
        + "`) and, for int8 cells, int8 (`"
        + refs.get("int8", "-")
        + "`); the first lines that differ, by 0-based index (all of them in the JSON):",
        "",
        "| cell | = float32 | differ | = int8 | differ |",
        "| --- | ---: | --- | ---: | --- |",
    ]

    def differ(a: dict[str, Any] | None) -> tuple[str, str]:
        if not a:
            return "", ""
        listed = ", ".join(map(str, a["differ"][:8])) + (" ..." if len(a["differ"]) > 8 else "")
        return str(a["agree"]), listed

    for cid, by_ref in r["agreement"].items():
        f, fl = differ(by_ref.get("float32"))
        i, il = differ(by_ref.get("int8"))
        lines.append(f"| `{cid}` | {f} | {fl} | {i} | {il} |")
    return lines


def reproduce(r: Report) -> list[str]:
    return [
        "",
        "## Reproduce",
        "",
        "```sh",
        "source scripts/env.sh",
        "python3 -m pip install -e 'tools[ct2]'",
        "cargo build --release -p nmt-server -p nmt-bench -p model-export",
        r["command"],
        "```",
        "",
        "The converted model, the int8 package, every worker's log and every cell's first-pass "
        "outputs stay in `--work` (default `/tmp/nmt-ct2-bench`). `--render JSON` rewrites "
        "this page from a run's JSON.",
        "",
    ]


def markdown(r: Report) -> str:
    sections = [
        header,
        modes_explained,
        throughput_table,
        goal_table,
        per_cell_table,
        ratio_table,
        agreement_table,
        reproduce,
    ]
    return "\n".join(line for section in sections for line in section(r))
