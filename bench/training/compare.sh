#!/usr/bin/env bash
# Training throughput of the shipped shape, candle (this crate) beside PyTorch on the same
# machine, interleaved so that both see the same machine state:
#
#   bench/training/compare.sh [REPEATS] [ROWS] [LEN]      (defaults: 5 repeats of 96 x 32)
#
# Each repeat runs `step_profile` (median of 4 steps after a warm-up) and the PyTorch anchor
# (float32, then bfloat16 autocast; 8 steps after 2 warm-ups). Prints every figure and the
# medians. Needs PyPI `torch` (`python3 -m pip install -e 'tools[torch]'`; the CPU wheel is
# enough) and the Python tools (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats=${1:-5}; rows=${2:-96}; len=${3:-32}
cargo build --release -q -p nmt-train --example step_profile
python3 -c "import torch" 2>/dev/null || { echo "compare.sh needs PyPI torch (python3 -m pip install -e 'tools[torch]')"; exit 1; }
python3 -c 'import os; from nmt_tools.machine import cpu_summary; print(f"cpu: {cpu_summary()}, {os.cpu_count()} cores")'
results=$(mktemp)
for i in $(seq "$repeats"); do
  candle=$(target/release/examples/step_profile transformer "$rows" "$len" 4 | sed -n 's/.*median \([0-9]*\) tgt.*/\1/p')
  f32=$(python3 -m nmt_tools.training.torch_train_bench --batch "$rows" --len "$len" | sed -n 's/.*: \([0-9]*\) target tok.*/\1/p')
  bf16=$(python3 -m nmt_tools.training.torch_train_bench --batch "$rows" --len "$len" --bf16 | sed -n 's/.*: \([0-9]*\) target tok.*/\1/p')
  echo "repeat $i: candle $candle  torch-f32 $f32  torch-bf16 $bf16 (target tok/s)"
  echo "$candle $f32 $bf16" >> "$results"
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
med = [statistics.median(col) for col in zip(*rows)]
print(f"median target tok/s: candle {med[0]:.0f}, torch float32 {med[1]:.0f}, torch bf16 {med[2]:.0f}; "
      f"candle / torch float32 = {med[0] / med[1]:.2f}")
PY
