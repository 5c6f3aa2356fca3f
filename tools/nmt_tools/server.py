"""nmt-server from the outside: its HTTP API (`POST /translate`, `/ready`, `/models`) and the
decoding limits it applies, read from the server itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def get_json(url: str, timeout: float = 60) -> Any:  # noqa: ANN401 (a JSON document)
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def translate(
    base_url: str, texts: list[str], model: str | None = None, batch_size: int | None = None, timeout: float = 600
) -> list[str]:
    """Translations of `texts`, in order, through `POST /translate`: one request, or one per
    `batch_size` texts (the server refuses more than `--max-texts-per-request` at once)."""
    step = batch_size or max(1, len(texts))
    out: list[str] = []
    for start in range(0, len(texts), step):
        body: dict[str, Any] = {"text": texts[start : start + step]}
        if model is not None:
            body["model"] = model
        request = urllib.request.Request(
            f"{base_url}/translate", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            out.extend(str(t["text"]) for t in json.load(response)["translations"])
    return out


def wait_ready(base_url: str, server: subprocess.Popen[str], timeout: float) -> None:
    """Returns once `GET /ready` answers 200; raises if the server exits or `timeout` seconds
    pass first (a model warms up before it is ready)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/ready", timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or 503 while warming up
        if server.poll() is not None:
            raise RuntimeError(f"nmt-server exited ({server.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base_url} not ready after {timeout:.0f} s")
        time.sleep(0.1)


@dataclass(frozen=True)
class Limit:
    """One of nmt-server's decoding limits: its flag, the variable it is also read from, and
    the value a server started with this environment would use."""

    flag: str
    env: str
    value: float | int


# The limits that decide what a sentence may be: its input length and its output budget,
# `RequestLimits::output_budget` in engine/src/limits.rs.
# The ratio is a float, the rest whole numbers of tokens (`DecodingArgs` in the same file).
LIMIT_FLAGS: dict[str, type[float] | type[int]] = {
    "--max-length-ratio": float,
    "--max-length-offset": int,
    "--max-input-tokens": int,
    "--max-output-tokens": int,
}

_OPTION_LINE = re.compile(r"^\s+(?:-\w, )?--[\w-]+")


def parse_limits(help_text: str) -> dict[str, Limit]:
    """The LIMIT_FLAGS out of `nmt-server --help` (clap's long help: `[env: NAME=VALUE]`
    shows a value the environment sets, `[default: X]` the default), by flag. Raises when a
    flag, its variable or its default is missing, so that a change to the server's flags stops
    the benchmark instead of letting it decode with a stale budget."""
    blocks: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if _OPTION_LINE.match(line):
            current = line.split("--", 1)[1].split()[0].rstrip(",")
            blocks[current] = ""
        if current is not None:
            blocks[current] += line + "\n"
    limits = {}
    for flag, kind in LIMIT_FLAGS.items():
        block = blocks.get(flag.removeprefix("--"), "")
        env = re.search(r"\[env: (\w+)=([^\]]*)\]", block)
        default = re.search(r"\[default: ([^\]]+)\]", block)
        if env is None or default is None:
            raise RuntimeError(f"`nmt-server --help` shows no {flag} with its variable and default: update {__name__}")
        limits[flag] = Limit(flag, env.group(1), kind(env.group(2) or default.group(1)))
    return limits


def server_limits(server_bin: str | Path, env: dict[str, str] | None = None) -> dict[str, Limit]:
    """The decoding limits `server_bin` applies when started with `env`, read from its --help."""
    done = subprocess.run(
        [str(server_bin), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ if env is None else env),
    )
    return parse_limits(done.stdout)
