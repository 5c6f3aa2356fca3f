#!/bin/bash
# Where nmt-server's time goes under load: for each build (NAME=SERVER_BIN@MODEL_DIR, as
# `nmt-bench --builds` takes them), runs 64 closed-loop clients for 25 s and records
# `perf record -g -a` over 15 s of it, then prints the worker thread's share of samples by
# library and by symbol. Run from the workspace root after
# `cargo build --release -p nmt-server -p nmt-bench`, on an otherwise idle machine.
#   scripts/profile-server.sh before=old/nmt-server@old/package after=target/release/nmt-server@models/en-es-rel-ldpe
# Writes OUT_DIR/perf-NAME.data and OUT_DIR/bench-NAME.txt (OUT_DIR defaults to runs/profile).
set -euo pipefail
source "$(dirname "$0")/env.sh"
out=${OUT_DIR:-runs/profile}
mkdir -p "$out"
[ $# -gt 0 ] || { echo "usage: $0 NAME=SERVER_BIN@MODEL_DIR ..." >&2; exit 2; }
for build in "$@"; do
  name=${build%%=*}
  target/release/nmt-bench --builds "$build" --baseline-mode "$name" --clients 64 \
    --seconds 25 --warmup-seconds 5 > "$out/bench-$name.txt" 2>&1 &
  bench=$!
  # The server starts (~10 s) and warms up before the window is recorded.
  sleep 22
  perf record -F 999 -g -a -o "$out/perf-$name.data" -- sleep 15 2> /dev/null
  wait "$bench"
  echo "== $name: $(grep -o '[0-9.]* tok/s' "$out/bench-$name.txt" | head -1)"
  for key in dso sym; do
    perf report -i "$out/perf-$name.data" --comm model-worker --no-children --sort "$key" \
      --stdio -g none 2> /dev/null | grep '%' | head -8
  done
done
