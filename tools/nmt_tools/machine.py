"""What a measurement says about the machine it ran on: these VMs vary between Intel and AMD
CPUs and are shared with training runs, so every report names the CPU, the instruction sets
its kernels can use, the load and the processes that competed for it."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# The instruction sets that decide which GEMM kernels ONNX Runtime, CTranslate2 and candle
# pick (x86 `flags`, Arm `Features`): int8 speed turns on VNNI, float32 on AVX-512.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
)


def _cpuinfo_field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def _read_cpuinfo() -> str:
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name: /proc/cpuinfo's `model name`, else lscpu's `Model name` (Arm
    kernels leave the former out), as nmt-bench's report reads it (bench/src/overload/report.rs)."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    name = _cpuinfo_field(text, "model name")
    if name:
        return name
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    return _cpuinfo_field(lscpu, "Model name") or platform.processor() or "unknown CPU"


def isa_flags(cpuinfo: str | None = None) -> list[str]:
    """The instruction sets of ISA_FLAGS this CPU has, in that order."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    present = set((_cpuinfo_field(text, "flags") or _cpuinfo_field(text, "Features") or "").split())
    return [flag for flag in ISA_FLAGS if flag in present]


def cpu_summary() -> str:
    """`<model> (<flags>)`, the CPU as a report's header names it."""
    flags = isa_flags()
    return f"{cpu_model()} ({', '.join(flags) or 'no SIMD flags read'})"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class ProcessTime:
    command: str
    nice: int
    ticks: int


def cpu_times() -> dict[int, ProcessTime]:
    """The CPU time of every process so far, from /proc."""
    times = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # Fields 14, 15 (utime, stime) and 19 (nice) of proc(5), counted from the state (3).
        times[int(entry)] = ProcessTime(command, int(fields[16]), int(fields[11]) + int(fields[12]))
    return times


def busy_processes(seconds: float = 2.0) -> list[dict[str, str | int]]:
    """Processes using at least 5% of a core over `seconds`, with their nice value: a shared
    machine says so in the report."""
    before = cpu_times()
    time.sleep(seconds)
    after = cpu_times()
    ticks = os.sysconf("SC_CLK_TCK") * seconds
    rows: list[dict[str, str | int]] = []
    for pid, now in after.items():
        if pid in before and pid != os.getpid():
            share = 100.0 * (now.ticks - before[pid].ticks) / ticks
            if share >= 5.0:
                rows.append({"pid": pid, "nice": now.nice, "cpu_percent": round(share), "command": now.command})
    return sorted(rows, key=lambda r: -int(r["cpu_percent"]))


def busy_summary(busy: list[dict[str, str | int]]) -> str:
    """The busy processes as a report's line lists them."""
    described = (f"{b['command']} (nice {b['nice']}, {b['cpu_percent']}% of a core)" for b in busy)
    return ", ".join(described) or "nothing"
