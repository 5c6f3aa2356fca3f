"""A benchmark cell's worker process (`nmt-bench-worker`, or compare.py's CTranslate2 side),
loaded and warmed up once, then asked for timed passes by lines on its stdin; each answers one
JSON line on its stdout."""

import json
import subprocess

from machine import ROOT


class Worker:
    """One cell's worker process, spoken to by lines on its stdin and stdout."""

    def __init__(self, cell, command, log_path, env):
        self.cell = cell
        self.command = command
        self.log_path = log_path
        self.log = open(log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.ready = self.read()
        if not self.ready.get("ready"):
            raise RuntimeError(f"{cell['id']}: unexpected first line {self.ready}")

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise RuntimeError(
                f"{self.cell['id']}: the worker exited ({self.proc.returncode}); "
                f"its log ({self.log_path}):\n{tail(self.log_path)}"
            )
        return json.loads(line)

    def run(self, outputs=None):
        self.proc.stdin.write("run" + (f" {outputs}" if outputs else "") + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


def tail(path, n=20):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(unreadable: {e})"
