"""A benchmark cell's worker process (`nmt-bench-worker`, or nmt_tools.ct2's CTranslate2
side), loaded and warmed up once, then asked for timed passes by lines on its stdin; each
answers one JSON line on its stdout (the protocol of bench/src/bin/nmt-bench-worker.rs)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import IO, Any

from nmt_tools.paths import repo_root


class Worker:
    """One cell's worker process, started in the repository root (where the binaries' default
    paths point), its stderr in `log_path`."""

    def __init__(self, cell_id: str, command: list[str], log_path: str | Path, env: dict[str, str]) -> None:
        self.cell_id = cell_id
        self.command = command
        self.log_path = Path(log_path)
        self.log: IO[str] = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=repo_root(),
            env=env,
        )
        self.ready = self.read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"{cell_id}: unexpected first line {self.ready}")

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise RuntimeError(
                f"{self.cell_id}: the worker exited ({self.proc.returncode}); "
                f"its log ({self.log_path}):\n{tail(self.log_path)}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, outputs: str | Path | None = None) -> dict[str, Any]:
        """One timed pass; with `outputs`, the worker writes its translations there."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("run" + (f" {outputs}" if outputs else "") + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        """Closes its stdin (a worker exits at the end of it) and waits for it."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


def tail(path: str | Path, n: int = 20) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(unreadable: {e})"
