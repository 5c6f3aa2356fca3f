#!/usr/bin/env bash
# Trains the shipped model's shape on a GPU with PyTorch (nmt_tools.training.torch_train) and
# leaves the checkpoints as files a size-capped transfer can carry back. Runs where torch,
# tokenizers and safetensors are installed and a CUDA device is present (a lent GPU machine);
# nothing here downloads. DATA holds what `nmt-train pairs` and a checkpoint give:
#   train.jsonl.xz, dev.jsonl (and any other *dev.jsonl, e.g. l10n-dev.jsonl), tokenizer.json,
#   config.json (the model to build), and optionally init.safetensors (weights to start from)
# Usage: DATA=gpu OUT=/tmp/out MINUTES=7.5 scripts/gpu-train.sh [extra torch_train flags]
#   CONFIG       the model to build (default DATA/config.json)
#   PREFIX       put before the names of the files written to OUT (default none)
#   KINDS        which weights come back: last, ema or both (default "last ema")
#   CHECKPOINTS  where the trainer writes (default /tmp/checkpoints; one per run when several
#                share the GPU, as scripts/gpu-train-jobs.sh runs them)
#   DEVICE       torch's device (default cuda); cpu trains here with --resume, so that a run
#                of hours spans sessions (scripts/cpu-train-jobs.sh)
#   PYTHON       the interpreter that has torch (default python3)
# Back here: python3 -m nmt_tools.training.torch_train join --parts OUT --prefix last- ...
set -uo pipefail
DATA=$(realpath "${DATA:?folder of training data}")
OUT=$(realpath "${OUT:?folder for the results}")
MINUTES=${MINUTES:-7.5}
CONFIG=$(realpath "${CONFIG:-$DATA/config.json}")
PREFIX=${PREFIX:-}
KINDS=${KINDS:-last ema}
CHECKPOINTS=${CHECKPOINTS:-/tmp/checkpoints}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
LOG=$OUT/${PREFIX}train.log
cd "$(dirname "$0")/../tools"
device=(--device "$DEVICE")
if [ "$DEVICE" = cpu ]; then
    # Appended to, not replaced: a resumed run's log keeps every leg's machine and speed.
    "$PYTHON" -c 'from nmt_tools.machine import cpu_summary; print(cpu_summary())' | tee -a "$LOG"
    device+=(--resume --save-minutes 10)
else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
fi
"$PYTHON" -c 'import torch, tokenizers; print("torch", torch.__version__, "tokenizers", tokenizers.__version__)' | tee -a "$LOG"
init=()
[ -f "$DATA/init.safetensors" ] && init=(--init-from "$DATA/init.safetensors")
dev=()
for f in "$DATA"/*dev.jsonl; do dev+=(--dev "$f"); done
PYTHONUNBUFFERED=1 "$PYTHON" -m nmt_tools.training.torch_train train \
    --pairs "$DATA/train.jsonl.xz" "${dev[@]}" \
    --tokenizer "$DATA/tokenizer.json" --config "$CONFIG" "${init[@]}" \
    --out "$CHECKPOINTS" --minutes "$MINUTES" --bf16 --ema-half "${device[@]}" "$@" 2>&1 | tee -a "$LOG"
status=$?
# Whatever was saved comes back, also after a failure or a kill mid-run.
for kind in $KINDS; do
    [ -d "$CHECKPOINTS/$kind" ] && "$PYTHON" -m nmt_tools.training.torch_train split \
        --checkpoint "$CHECKPOINTS/$kind" --out "$OUT" --prefix "$PREFIX$kind-" --max-mib 15.9
done
# The last moving average's state says how far the run went, also when only its best point
# comes back.
case " $KINDS " in
    *" ema "*) ;;
    *) [ -f "$CHECKPOINTS/ema/trainer_state.json" ] && cp "$CHECKPOINTS/ema/trainer_state.json" "$OUT/${PREFIX}final-trainer_state.json" ;;
esac
exit $status
