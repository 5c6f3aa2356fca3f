#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, builds the binaries the
# end-to-end tests start, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo build --workspace --bins
cargo test --workspace "$@"
