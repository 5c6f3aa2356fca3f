#!/usr/bin/env bash
# The Python checks, as scripts/test.sh runs them: ruff's lint and format, mypy --strict (the
# settings of all three in tools/pyproject.toml), then the smoke tests. The scripts the Rust
# binaries carry (include_str!) stay beside their crates, so that each crate builds from its own
# folder and nmt-export and nmt-eval run them without this package installed; they are held to
# the same rules here.
set -euo pipefail
cd "$(dirname "$0")"
EMBEDDED=(../eval/src/sacrebleu_cli.py ../model-export/python/quantize.py ../model-export/python/marian_tokenizers.py ../model-export/python/length_head.py)
python3 -m ruff check . "${EMBEDDED[@]}"
python3 -m ruff format --check . "${EMBEDDED[@]}"
python3 -m mypy nmt_tools tests "${EMBEDDED[@]}"
python3 -m pytest
