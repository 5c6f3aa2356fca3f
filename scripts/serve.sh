#!/usr/bin/env bash
# Serves translations from the model package that ships with the repo. Extra arguments go to
# nmt-server (see `nmt-server --help`), e.g. `scripts/serve.sh --port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo build --release -p nmt-server
exec target/release/nmt-server --model-dir models/en-es-rel-ldpe "$@"
