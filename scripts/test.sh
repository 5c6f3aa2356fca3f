#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, checks the Python tools (ruff,
# mypy, their smoke tests: seconds), checks formatting and lints (first, so that a finding shows
# before the long build), builds the binaries the end-to-end tests start, then runs every test
# of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
bash tools/check.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
cargo test --workspace "$@"
