# Runs sacrebleu's own command line (sacrebleu.sacrebleu.main, what `python3 -m sacrebleu`
# runs) once per job, in one process so that the import is paid once. Reads a JSON list of
# argument lists on stdin; writes a JSON list of {"exit": code, "stdout": text}.
import json
import os
import sys
import tempfile

# sacrebleu 2.6.0's `--paired-bs -f json` crashes on the numpy floats in its results
# ("Object of type float32 is not JSON serializable"): encode them as plain numbers.
_default = json.JSONEncoder.default
json.JSONEncoder.default = lambda self, o: o.item() if hasattr(o, "item") else _default(self, o)
# Its `--confidence` crashes when some bootstrap scores are Python floats and others numpy
# float32 (chrF of a resample whose hypotheses are all empty: "don't know how to coerce float
# and float32"): average them as floats.
import statistics  # noqa: E402
import types  # noqa: E402

import sacrebleu.metrics.base  # noqa: E402

sacrebleu.metrics.base.statistics = types.SimpleNamespace(
    mean=lambda scores: statistics.mean([float(s) for s in scores])
)
# No colorama wrapping of stdout, which main() would otherwise stack up call after call.
os.environ["NO_COLOR"] = "1"

from sacrebleu.sacrebleu import main  # noqa: E402


class Fd:
    """What main() reopens as sys.stdin / sys.stdout (`open(sys.stdout.fileno(), ...)`): a
    fresh duplicate of `fd` each time, so the file object it opens owns only that copy."""

    def __init__(self, fd):
        self.fd = fd

    def fileno(self):
        return os.dup(self.fd)


jobs = json.load(sys.stdin)
real_stdout = sys.stdout
devnull = os.open(os.devnull, os.O_RDONLY)
results = []
for argv in jobs:
    with tempfile.TemporaryFile() as captured:
        sys.argv = ["sacrebleu", *argv]
        sys.stdin, sys.stdout = Fd(devnull), Fd(captured.fileno())
        code = 0
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            if not isinstance(sys.stdout, Fd):
                sys.stdout.close()
            sys.stdout = real_stdout
        captured.seek(0)
        results.append({"exit": code, "stdout": captured.read().decode("utf-8")})
json.dump(results, real_stdout)
