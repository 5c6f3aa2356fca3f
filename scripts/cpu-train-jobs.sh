#!/usr/bin/env bash
# The runs of a GPU job file (scripts/gpu-train-jobs.sh's format), trained on this machine's
# CPU instead, one after another, niced and resumable: a run of the shipped shape takes hours
# here (about 2,000 target subwords/s on 2 cores against 110,000 on an H100), so each run keeps
# a snapshot (torch_train --resume) under CHECKPOINTS/NAME and this command, run again in a
# later session, goes on where the last one stopped. What comes back is what gpu-train-jobs.sh
# leaves in OUT (NAME.KIND-weights-K.safetensors, NAME.KIND-trainer_state.json,
# NAME.final-trainer_state.json, NAME.train.log), so the same import reads either.
#
#   OUT=runs/cpu-out PYTHON=/path/to/venv/bin/python scripts/cpu-train-jobs.sh JOBS_FILE [NAME...]
#
# NAME...: the runs to train, in this order (default: every run of the file). KINDS as in
# gpu-train-jobs.sh (default ema); CHECKPOINTS default runs/cpu-train; PYTHON the interpreter
# with torch (`pip install -e 'tools[torch]'`, the CPU wheel is enough).
set -uo pipefail
JOBS=$(realpath "${1:?file of runs, one per line: NAME DATA CONFIG FLAGS...}")
shift
mkdir -p "${OUT:?folder for the results}"
OUT=$(realpath "$OUT")
KINDS=${KINDS:-ema}
cd "$(dirname "$0")/.."
CHECKPOINTS=$(realpath -m "${CHECKPOINTS:-runs/cpu-train}")
wanted=" $* "
failed=0
while read -r name data config flags; do
    case "$name" in "" | "#"*) continue ;; esac
    [ $# -eq 0 ] || [[ "$wanted" == *" $name "* ]] || continue
    echo "== $name (log: $OUT/$name.train.log)"
    # No wall-clock budget: a run ends at its own --max-steps, or when the session does.
    # shellcheck disable=SC2086 # FLAGS are words
    DATA=$data CONFIG=$config OUT=$OUT PREFIX=$name. KINDS=$KINDS CHECKPOINTS=$CHECKPOINTS/$name \
        DEVICE=cpu MINUTES=1000000 nice -n 10 bash scripts/gpu-train.sh $flags > /dev/null 2>&1 < /dev/null ||
        { echo "cpu-train-jobs: $name failed" >&2; failed=1; }
    grep '^step' "$OUT/$name.train.log" | tail -n 1
done < "$JOBS"
exit $failed
