"""The synthetic length-generalization check, through the server: starts nmt-server on the
given packages, sends every test split of a synthetic corpus (one source a line) to each model
and prints, per model and split, the share of outputs identical to the source, the share of
positions right, and the mean output length in symbols. It grades a copy task, whose
translation is its source (docs/experiments/length-generalization.md, "First attempt"; the
experiment itself runs in tests/tests/length_generalization.rs).

    python3 -m nmt_tools.studies.length_generalization --corpus DIR PACKAGE...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.error
from pathlib import Path

from nmt_tools.server import get_json, translate, wait_ready

MODULE = "nmt_tools.studies.length_generalization"


def scores(sources: list[str], outputs: list[str]) -> tuple[float, float, float]:
    """(exact, per-position, mean output symbols) of a copy task's outputs."""
    pairs = list(zip(outputs, sources, strict=True))
    exact = sum(o.split() == s.split() for o, s in pairs) / len(sources)
    right = sum(sum(a == b for a, b in zip(o.split(), s.split(), strict=False)) for o, s in pairs)
    per_position = right / sum(len(s.split()) for s in sources)
    mean_length = sum(len(o.split()) for o in outputs) / len(outputs)
    return exact, per_position, mean_length


def start_server(server_bin: str, packages: list[str], max_input_tokens: int) -> tuple[subprocess.Popen[str], str]:
    """nmt-server on free ports; its process and base URL (announced on its first line)."""
    command = [server_bin, "--model-dir", ",".join(packages), "--port", "0", "--grpc-port", "0"]
    command += ["--max-input-tokens", str(max_input_tokens), "--max-texts-per-request", "1000"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdout is not None
    return server, server.stdout.readline().split()[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"python3 -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("packages", nargs="+", help="model packages, served together")
    p.add_argument("--corpus", type=Path, required=True, help="the synthetic corpus: <SPLIT>.en files")
    p.add_argument("--splits", nargs="+", default=["test12", "test20"], help="test splits to send")
    p.add_argument("--server-bin", default="target/release/nmt-server")
    p.add_argument("--max-input-tokens", type=int, default=1000)
    p.add_argument("--ready-timeout", type=float, default=300, help="seconds for the models to load and warm up")
    args = p.parse_args(argv)
    server, url = start_server(args.server_bin, args.packages, args.max_input_tokens)
    try:
        wait_ready(url, server, args.ready_timeout)
        models = [m["name"] for m in get_json(f"{url}/models")["models"]]
        for split in args.splits:
            sources = (args.corpus / f"{split}.en").read_text().split("\n")[:-1]
            for model in models:
                try:
                    outputs = translate(url, sources, model=model)
                except urllib.error.HTTPError as e:
                    print(model, split, e.read())
                    continue
                exact, per_position, mean_length = scores(sources, outputs)
                print(
                    f"{model:28s} {split}: exact {exact:.2f}  per-position {per_position:.2f}  "
                    f"mean output symbols {mean_length:.1f}"
                )
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
