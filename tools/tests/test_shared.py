"""The helpers every tool shares: the machine, provenance, the server's limits, the inputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO

from nmt_tools import machine, provenance, server, verses
from nmt_tools.paths import repo_root, shown

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw
"""
ARM_CPUINFO = """processor\t: 0
Features\t: fp asimd asimddp sve i8mm
"""


def test_cpu_name_and_flags_from_cpuinfo() -> None:
    assert machine.cpu_model(X86_CPUINFO) == "AMD EPYC 7B13"
    assert machine.isa_flags(X86_CPUINFO) == ["avx", "avx2", "fma", "avx512f", "avx512bw"]
    assert machine.isa_flags(ARM_CPUINFO) == ["asimd", "asimddp", "sve", "i8mm"]


def test_this_machine_is_described() -> None:
    assert machine.cpu_model()
    assert machine.cpu_summary().startswith(machine.cpu_model())
    assert len(machine.loadavg().split()) == 3
    me = machine.cpu_times()[os.getpid()]
    assert me.command and me.ticks >= 0
    assert machine.busy_summary([]) == "nothing"
    assert machine.busy_summary([{"command": "nmt-train", "nice": 19, "cpu_percent": 97}]) == (
        "nmt-train (nice 19, 97% of a core)"
    )


def test_provenance() -> None:
    state = provenance.git_state()
    assert len(str(state["commit"])) == 40 and isinstance(state["dirty"], bool)
    assert str(state["commit"]).startswith(provenance.short_commit())
    assert provenance.version("pytest") == pytest.__version__
    assert provenance.version("no-such-distribution") == "not installed"
    assert provenance.command_line("nmt_tools.x", ["--a", "b c"]) == "python3 -m nmt_tools.x --a 'b c'"
    assert provenance.utc_now().endswith(" UTC")


def test_repository_root() -> None:
    assert repo_root() == REPO
    assert shown(REPO / "models" / "x") == "models/x"
    assert shown("/elsewhere/x") == "/elsewhere/x"


# What clap prints for the limits (`nmt-server --help`), one of them set by the environment.
HELP = """Options:
      --max-input-tokens <MAX_INPUT_TOKENS>
          Most subword tokens in one text (413 above)

          [env: NMT_MAX_INPUT_TOKENS=]
          [default: 1024]

      --max-output-tokens <MAX_OUTPUT_TOKENS>
          Most subword tokens generated for one text

          [env: NMT_MAX_OUTPUT_TOKENS=]
          [default: 1024]

      --max-length-ratio <MAX_LENGTH_RATIO>
          Without a target length, a text stops after `ratio * source_tokens + offset` tokens

          [env: NMT_MAX_LENGTH_RATIO=3.5]
          [default: 2]

      --max-length-offset <MAX_LENGTH_OFFSET>
          See `--max-length-ratio`

          [env: NMT_MAX_LENGTH_OFFSET=]
          [default: 10]

  -h, --help
          Print help (see a summary with '-h')
"""


def test_server_limits_from_help() -> None:
    limits = server.parse_limits(HELP)
    assert {f: (lim.env, lim.value) for f, lim in limits.items()} == {
        "--max-length-ratio": ("NMT_MAX_LENGTH_RATIO", 3.5),
        "--max-length-offset": ("NMT_MAX_LENGTH_OFFSET", 10),
        "--max-input-tokens": ("NMT_MAX_INPUT_TOKENS", 1024),
        "--max-output-tokens": ("NMT_MAX_OUTPUT_TOKENS", 1024),
    }
    assert isinstance(limits["--max-length-offset"].value, int)


def test_a_renamed_limit_stops_the_benchmark() -> None:
    with pytest.raises(RuntimeError, match="--max-length-offset"):
        server.parse_limits(HELP.replace("--max-length-offset", "--length-offset"))


SERVER_BIN = REPO / "target" / "release" / "nmt-server"


@pytest.mark.skipif(not SERVER_BIN.exists(), reason="no release nmt-server built")
def test_limits_of_the_built_server() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NMT_")}
    limits = server.server_limits(SERVER_BIN, dict(env, NMT_MAX_LENGTH_OFFSET="12"))
    assert limits["--max-length-offset"].value == 12
    assert limits["--max-length-ratio"].value > 0


def test_verses_as_nmt_bench_reads_them(tmp_path: Path) -> None:
    # The cases of bench/src/verses.rs's own tests.
    assert verses.parse_lines("Jesus wept.\n\n  In the beginning.  \n") == ["Jesus wept.", "In the beginning."]
    text = "n_verses\tref\ten\tes\n2\tDan 1:1-2\tA b.\tC d.\n4\tDan 1:3-6\tE f.\tG h.\n"
    assert verses.parse_tsv(text) == ["A b.", "E f."]
    for bad in ("a\tb\n1\t2\n", "en\tes\nx\n", ""):
        with pytest.raises(ValueError):
            verses.parse_tsv(bad)
    (tmp_path / "groups.TSV").write_text(text)
    assert verses.load(tmp_path / "groups.TSV") == ["A b.", "E f."]
    (tmp_path / "empty.en").write_text("\n \n")
    with pytest.raises(ValueError, match="no texts"):
        verses.load(tmp_path / "empty.en")
