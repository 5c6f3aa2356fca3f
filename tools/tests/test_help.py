"""Every runnable module explains itself with --help, without the heavy packages it imports
when it runs (they are imported inside the functions that need them)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import PACKAGE

# Imported by the tools only when they run; --help must not need any of them.
HEAVY = [
    "ctranslate2",
    "torch",
    "onnxruntime",
    "onnx",
    "numpy",
    "tokenizers",
    "polib",
    "matplotlib",
    "sacrebleu",
    "transformers",
    "sentencepiece",
    "safetensors",
]

# Runs a module as `python3 -m` does, with the heavy packages made unimportable.
RUN_WITHOUT_HEAVY = """
import importlib.abc, runpy, sys
heavy = set(sys.argv[2].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in heavy:
            raise ImportError(f"{name} imported by --help")
        return None
sys.meta_path.insert(0, Refuse())
module = sys.argv[1]
sys.argv = [module, "--help"]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def runnable_modules() -> list[str]:
    """Every module of the package with a `__main__` block."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"):
            relative = path.relative_to(PACKAGE.parent).with_suffix("")
            modules.append(".".join(relative.parts))
    return modules


def test_every_tool_is_found() -> None:
    assert set(runnable_modules()) == {
        "nmt_tools.ct2.compare",
        "nmt_tools.ct2.convert",
        "nmt_tools.ct2.worker",
        "nmt_tools.decoding.step_floor",
        "nmt_tools.device.cuda_pack",
        "nmt_tools.device.ort_profile",
        "nmt_tools.eval.catalogs",
        "nmt_tools.eval.evaluate",
        "nmt_tools.eval.probes",
        "nmt_tools.int8.presets",
        "nmt_tools.marian.fixture",
        "nmt_tools.marian.train",
        "nmt_tools.studies.length_generalization",
        "nmt_tools.studies.length_study",
        "nmt_tools.studies.candidate_choice",
        "nmt_tools.studies.char_length",
        "nmt_tools.studies.exact_endings",
        "nmt_tools.studies.length_control",
        "nmt_tools.studies.position_study",
        "nmt_tools.training.length_bert",
        "nmt_tools.training.torch_train",
        "nmt_tools.training.torch_train_bench",
    }


@pytest.mark.parametrize("module", runnable_modules())
def test_help_exits_0_without_heavy_packages(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_HEAVY, module, ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "python3 -m " + module in done.stdout
