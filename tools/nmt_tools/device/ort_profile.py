"""What an ONNX Runtime profile says (the JSON a session writes with profiling on:
`NMT_ORT_PROFILE=PREFIX` makes every session the engine opens write one): per graph, its runs
and their mean time, the node runs per model run by execution provider (a node a CUDA session
leaves on the CPU shows here, with the copies it costs), and where the time goes by operator.

    python3 -m nmt_tools.device.ort_profile PREFIX-decoder_*.json [--top 15]

A CUDA node's time is the host's: kernels are launched asynchronously, so the wait for the
GPU lands on whatever node next synchronizes (a copy to the host), and a model run's time is
the whole step's.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Summary:
    """One profile, summed."""

    model_runs: int = 0
    run_us: int = 0
    node_runs: Counter[str] = field(default_factory=Counter)
    op_us: Counter[tuple[str, str]] = field(default_factory=Counter)
    op_runs: Counter[tuple[str, str]] = field(default_factory=Counter)

    def mean_run_ms(self) -> float:
        return self.run_us / self.model_runs / 1000 if self.model_runs else 0.0


def summarize(events: list[dict[str, Any]]) -> Summary:
    summary = Summary()
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            summary.model_runs += 1
            summary.run_us += int(event["dur"])
        elif event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            args = event.get("args", {})
            provider = str(args.get("provider", "?")).removesuffix("ExecutionProvider")
            key = (provider, str(args.get("op_name", "?")))
            summary.node_runs[provider] += 1
            summary.op_us[key] += int(event["dur"])
            summary.op_runs[key] += 1
    return summary


def report(name: str, summary: Summary, top: int) -> list[str]:
    runs = max(summary.model_runs, 1)
    per_run = ", ".join(f"{p} {n / runs:.0f}" for p, n in summary.node_runs.most_common())
    total = sum(summary.op_us.values()) or 1
    lines = [
        f"## {name}",
        "",
        f"{summary.model_runs} model runs, {summary.mean_run_ms():.3f} ms each on average; "
        f"node runs per model run by provider: {per_run}",
        "",
        "| provider | operator | node runs per model run | µs per model run | share of node time |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for (provider, op), us in summary.op_us.most_common(top):
        lines.append(
            f"| {provider} | {op} | {summary.op_runs[(provider, op)] / runs:.1f} | {us / runs:.1f} | "
            f"{100 * us / total:.1f}% |"
        )
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", type=Path, nargs="+", help="ONNX Runtime profile JSON files")
    parser.add_argument("--top", type=int, default=15, help="operators listed per profile, by time")
    args = parser.parse_args()
    for path in args.profiles:
        summary = summarize(json.loads(path.read_text(encoding="utf-8")))
        print("\n".join(report(path.name, summary, args.top)))


if __name__ == "__main__":
    main()
