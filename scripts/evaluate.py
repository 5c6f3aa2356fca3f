#!/usr/bin/env python3
"""Thin wrapper around `nmt-eval` (crate `eval/`), kept so that the command recorded in the
shipped manifest's `evaluation` field still runs: builds nmt-eval (release) and runs it with
the same arguments, `--package models/en-es-rel-ldpe` when none is given.

    python3 scripts/evaluate.py --split dev

`nmt-eval --help` explains every flag; docs/evaluation.md says what the report holds.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "nmt-eval"], cwd=ROOT, check=True)
    target = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR", "target"))
    binary = os.path.join(target, "release", "nmt-eval")
    args = sys.argv[1:]
    if "--package" not in args:
        args = ["--package", os.path.join(ROOT, "models", "en-es-rel-ldpe"), *args]
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
