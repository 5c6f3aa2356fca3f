"""What a benchmark says about the machine it ran on: these VMs vary between Intel and AMD
CPUs and are shared with training runs, so every report names the CPU, the load and the
processes that competed for it."""

import os
import platform
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_times():
    """{pid: (command, nice, utime + stime in ticks)} of every process, from /proc."""
    times = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # Fields 14, 15 (utime, stime) and 19 (nice) of proc(5), counted from the state (3).
        times[int(pid)] = (command, int(fields[16]), int(fields[11]) + int(fields[12]))
    return times


def busy_processes(seconds=2.0):
    """Processes using at least 5% of a core over `seconds`, with their nice value: a shared
    machine says so in the report."""
    before = cpu_times()
    time.sleep(seconds)
    after = cpu_times()
    ticks = os.sysconf("SC_CLK_TCK") * seconds
    rows = []
    for pid, (command, nice, t) in after.items():
        if pid in before and pid != os.getpid():
            share = 100.0 * (t - before[pid][2]) / ticks
            if share >= 5.0:
                rows.append({"pid": pid, "nice": nice, "cpu_percent": round(share), "command": command})
    return sorted(rows, key=lambda r: -r["cpu_percent"])


def git_state():
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])
