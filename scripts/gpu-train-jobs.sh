#!/usr/bin/env bash
# Several trainings at once on one lent GPU (scripts/gpu-train.sh each). The shipped shape is
# small enough that one run leaves the GPU waiting on Python between kernels, so runs side by
# side cost little more wall-clock time than one, and a lease of minutes serves several
# issues. Only the weights named in KINDS come back (by default the moving averages, the
# weights the packages are made from), and the logs and trainer states are packed into one
# archive: the device tool returns at most 8 files.
#
#   OUT=/tmp/out MINUTES=8.5 scripts/gpu-train-jobs.sh JOBS_FILE
#
# JOBS_FILE: one run per line, `NAME DATA CONFIG FLAGS...` (DATA and CONFIG as gpu-train.sh
# reads them, relative to the repository; FLAGS are torch_train's); `#` starts a comment.
# Each run stops at MINUTES or at its own --max-steps, whichever comes first. KINDS says which
# weights come back (default ema; `best` with torch_train's --eval-steps: the moving average at
# its lowest dev loss). Back here, per run: python3 -m nmt_tools.training.torch_train join
# --parts OUT --prefix NAME.ema- ... after `tar -xf OUT/meta.tar -C OUT`.
set -uo pipefail
JOBS=$(realpath "${1:?file of runs, one per line: NAME DATA CONFIG FLAGS...}")
OUT=$(realpath "${OUT:?folder for the results}")
MINUTES=${MINUTES:-7.5}
KINDS=${KINDS:-ema}
cd "$(dirname "$0")/.."
pids=()
names=()
while read -r name data config flags; do
    case "$name" in "" | "#"*) continue ;; esac
    # Two threads each: the CPU side of every run is its batching and the optimizer's bookkeeping.
    # shellcheck disable=SC2086 # FLAGS are words
    DATA=$data CONFIG=$config OUT=$OUT PREFIX=$name. KINDS=$KINDS CHECKPOINTS=/tmp/checkpoints/$name \
        MINUTES=$MINUTES OMP_NUM_THREADS=2 bash scripts/gpu-train.sh $flags > /dev/null 2>&1 &
    pids+=($!)
    names+=("$name")
done < "$JOBS"
failed=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "gpu-train-jobs: ${names[$i]} failed" >&2; failed=1; }
done
for name in "${names[@]}"; do
    echo "== $name"
    grep -v '^step' "$OUT/$name.train.log" | tail -n 4
    grep '^step' "$OUT/$name.train.log" | tail -n 1
done
(cd "$OUT" && tar -cf meta.tar ./*.train.log ./*trainer_state.json && rm -f ./*.train.log ./*trainer_state.json)
ls -l "$OUT"
exit $failed
