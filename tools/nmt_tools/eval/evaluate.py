"""Thin wrapper around `nmt-eval` (crate `eval/`): builds nmt-eval (release) and runs it with
the same arguments, `--package models/en-es-rel-ldpe` when none is given.

    python3 -m nmt_tools.eval.evaluate --split dev

Every argument but --help goes to nmt-eval: `nmt-eval --help` explains them;
docs/evaluation.md says what the report holds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from nmt_tools.paths import repo_root

MODULE = "nmt_tools.eval.evaluate"


def nmt_eval_args(args: list[str]) -> list[str]:
    """nmt-eval's arguments: these, with the shipped package when none is named."""
    if "--package" not in args:
        return ["--package", str(repo_root() / "models" / "en-es-rel-ldpe"), *args]
    return args


def passed_on(argv: list[str] | None) -> list[str]:
    """The arguments for nmt-eval, in their order; --help is answered here."""
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"python3 -m {MODULE} [NMT_EVAL_ARGS...]",
        allow_abbrev=False,
    )
    _, passed = p.parse_known_args(argv)
    return passed


def main(argv: list[str] | None = None) -> int:
    passed = passed_on(argv)
    root = repo_root()
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "nmt-eval"], cwd=root, check=True)
    binary = str(root / os.environ.get("CARGO_TARGET_DIR", "target") / "release" / "nmt-eval")
    os.execv(binary, [binary, *nmt_eval_args(passed)])


if __name__ == "__main__":
    sys.exit(main())
