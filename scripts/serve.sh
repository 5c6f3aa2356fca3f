#!/usr/bin/env bash
# Serves translations from the model package that ships with the repo. Extra arguments go to
# nmt-server (see `nmt-server --help`), e.g. `scripts/serve.sh --port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo build --release -p nmt-server
# The first package answers requests that name none: software strings, modern text and the
# Bible; the Bible-only model stays selectable as "model": "en-es-rel-ldpe".
exec target/release/nmt-server --model-dir models/en-es-l10n,models/en-es-rel-ldpe "$@"
