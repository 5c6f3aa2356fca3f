# Runs sacrebleu's own command line (sacrebleu.sacrebleu.main, what `python3 -m sacrebleu`
# runs) once per job, in one process so that the import is paid once. Reads a JSON list of
# argument lists on stdin; writes a JSON list of {"exit": code, "stdout": text}. nmt-eval
# carries this file (include_str! in sacrebleu.rs) and runs it with `python3 -c`; it is checked
# with the tools/ package's ruff and mypy rules (tools/check.sh).
import json
import os
import sys
import tempfile
from typing import Any, TextIO

# sacrebleu 2.6.0's `--paired-bs -f json` crashes on the numpy floats in its results
# ("Object of type float32 is not JSON serializable"): encode them as plain numbers.
_default = json.JSONEncoder.default
json.JSONEncoder.default = lambda self, o: o.item() if hasattr(o, "item") else _default(self, o)  # type: ignore[method-assign]
# Its `--confidence` crashes when some bootstrap scores are Python floats and others numpy
# float32 (chrF of a resample whose hypotheses are all empty: "don't know how to coerce float
# and float32"): average them as floats.
import statistics  # noqa: E402
import types  # noqa: E402

import sacrebleu.metrics.base  # noqa: E402

sacrebleu.metrics.base.statistics = types.SimpleNamespace(  # type: ignore[attr-defined,assignment]
    mean=lambda scores: statistics.mean([float(s) for s in scores])
)
# No colorama wrapping of stdout, which main() would otherwise stack up call after call.
os.environ["NO_COLOR"] = "1"

from sacrebleu.sacrebleu import main  # noqa: E402


class Fd:
    """What main() reopens as sys.stdin / sys.stdout (`open(sys.stdout.fileno(), ...)`): a
    fresh duplicate of `fd` each time, so the file object it opens owns only that copy."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return os.dup(self.fd)


def redirect(stdin: Any, stdout: Any) -> None:  # noqa: ANN401 (an Fd or a file)
    """Points sys.stdin and sys.stdout at what main() reopens (an Fd) or back at a real file."""
    sys.stdin = stdin
    sys.stdout = stdout


def run(argv: list[str], devnull: int, real_stdout: TextIO) -> dict[str, Any]:
    """One sacrebleu command line: its exit code and what it printed."""
    with tempfile.TemporaryFile() as captured:
        sys.argv = ["sacrebleu", *argv]
        redirect(Fd(devnull), Fd(captured.fileno()))
        code = 0
        try:
            main()  # type: ignore[no-untyped-call]
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            opened = sys.stdout
            if not isinstance(opened, Fd):
                opened.close()
            redirect(sys.stdin, real_stdout)
        captured.seek(0)
        return {"exit": code, "stdout": captured.read().decode("utf-8")}


jobs = json.load(sys.stdin)
real_stdout = sys.stdout
devnull = os.open(os.devnull, os.O_RDONLY)
json.dump([run(argv, devnull, real_stdout) for argv in jobs], real_stdout)
