#!/usr/bin/env bash
# The papers' length findings on our corpus: absolute vs relative vs recurrent positions on
# inputs longer than those seen in training. Trains every model of the study, exports it,
# evaluates it through the serving engine (nmt-eval) and writes
# docs/experiments/position-study.md with its plots. Re-runnable: a finished run is skipped,
# an unfinished one resumes from its last checkpoint, so the study can span sessions.
#
#   scripts/position-study.sh [--quick]
#
# Settings (environment):
#   STUDY_DIR    where runs, packages and reports go (default runs/position-study)
#   STUDY_STEPS  optimizer steps per model, the same for every model (default 1500)
#   STUDY_CAP    source subwords of the short-only training data, (b) (default 32)
#   STUDY_JOBS   models trained at once, one core each (default 2)
#   STUDY_DOC    the write-up (default docs/experiments/position-study.md; Oka et al.'s table
#                of length encodings goes beside it, length-encodings.md)
#   STUDY_PREDICTOR_FROM  the package whose length predictor the LDPE/LRPE packages get
#                (default models/en-es-rel-ldpe)
# --quick: tiny models, 40 steps, 60 test verses: checks the pipeline in minutes, writes to
# runs/position-study-quick and its own doc there, never to docs/.
set -euo pipefail
# Braces: bash reads the whole script before running it, so the script can be edited while a
# study of several hours runs.
{
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ $quick = 1 ]; then
  dir=${STUDY_DIR:-runs/position-study-quick}
  steps=${STUDY_STEPS:-40}
  size=tiny
  eval_flags=(--limit 60 --bootstrap-samples 100)
  doc=${STUDY_DOC:-$dir/position-study.md}
else
  dir=${STUDY_DIR:-runs/position-study}
  steps=${STUDY_STEPS:-1500}
  size=small
  eval_flags=()
  doc=${STUDY_DOC:-docs/experiments/position-study.md}
fi
cap=${STUDY_CAP:-32}
jobs=${STUDY_JOBS:-2}

# Neishi & Yoshinaga's and Rosendahl et al.'s systems, Chen et al.'s RPEHead, and the RNN
# baseline; the Transformer (sinusoidal) is the baseline of every paired bootstrap.
MODELS=(transformer transformer-learned rel-transformer rnn-transformer rr-transformer lstm-pe rpe-head rnn-nmt)
THIRDS_MODELS=(transformer rel-transformer)
# Oka et al.'s table, at the same size and budget: the Transformer (above) against its decoder
# with LDPE or LRPE, trained with length noise 0, [-2, 2] and [-4, 4]; written to
# docs/experiments/length-encodings.md. Their "auto" length comes from the shipped package's
# BERT predictor, copied into each package (it reads only the source text).
LENGTH_MODELS=(ldpe ldpe-noise2 ldpe-noise4 lrpe lrpe-noise2 lrpe-noise4)
PREDICTOR_FROM=${STUDY_PREDICTOR_FROM:-models/en-es-rel-ldpe}

bash scripts/setup.sh >&2
source scripts/env.sh
cargo build --release -q -p nmt-train -p model-export -p nmt-eval
bin=target/release
[ -f data/corpus/train.en ] || $bin/nmt-train corpus --out data/corpus
[ -f data/tokenizer.json ] || $bin/nmt-train tokenizer --corpus data/corpus --vocab-size 8000 --out data/tokenizer.json
python3 -c "import tokenizers" 2>/dev/null ||
  python3 -m pip install -q --disable-pip-version-check tokenizers==0.23.3
mkdir -p "$dir/runs" "$dir/pkg"

# The training data's source-length terciles (subwords, EOS not counted): the bands of the
# short / middle / long thirds.
read -r t1 t2 < <(python3 scripts/position_study.py terciles data/tokenizer.json data/corpus/train.en)
echo "position-study: source terciles $t1 / $t2, short-only cap $cap, $steps steps, $size models" >&2

# One line per run: NAME PRESET EXTRA_TRAIN_FLAGS...
runs_list() {
  for m in "${MODELS[@]}"; do
    echo "$m.all $m-$size"
    echo "$m.short $m-$size --max-source-len $cap"
  done
  for m in "${LENGTH_MODELS[@]}"; do
    echo "$m.all $m-$size"
  done
  for m in "${THIRDS_MODELS[@]}"; do
    echo "$m.third1 $m-$size --max-source-len $t1"
    echo "$m.third2 $m-$size --min-source-len $((t1 + 1)) --max-source-len $t2"
    echo "$m.third3 $m-$size --min-source-len $((t2 + 1))"
  done
}

train_one() { # NAME PRESET FLAGS...
  local name=$1 preset=$2
  shift 2
  local out=$dir/runs/$name
  if [ -f "$out/report.json" ] && python3 - "$out/report.json" "$steps" <<'EOF'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["state"]["step"] >= int(sys.argv[2]) else 1)
EOF
  then
    echo "position-study: $name trained" >&2
    return 0
  fi
  echo "position-study: training $name ($preset $*)" >&2
  mkdir -p "$out"
  # One core per run: two runs side by side use this machine better than one run on two.
  RAYON_NUM_THREADS=1 $bin/nmt-train train --preset "$preset" --out "$out" --resume \
    --batch-tokens 3000 --lr 1e-3 --warmup-steps 400 --max-steps "$steps" \
    --eval-every 250 --save-every 50 --snapshot-every 1000000 --keep-snapshots 1 \
    --dev-limit 200 --max-len 128 --quiet "$@" > "$out/report.json.tmp" 2> "$out/train.log"
  mv "$out/report.json.tmp" "$out/report.json"
}
export -f train_one
export dir steps bin

runs_list | xargs -P "$jobs" -L 1 bash -c 'train_one "$@"' _

for name in $(runs_list | cut -d' ' -f1); do
  pkg=$dir/pkg/$name
  [ -f "$pkg/manifest.json" ] && [ "$pkg/manifest.json" -nt "$dir/runs/$name/report.json" ] && continue
  rm -rf "$pkg"
  $bin/nmt-export --checkpoint "$dir/runs/$name/last" --tokenizer data/tokenizer.json \
    --name "$name" --out "$pkg" >&2
  case " ${LENGTH_MODELS[*]} " in
    *" ${name%.all} "*) $bin/nmt-export length-predictor --package "$pkg" --from-package "$PREDICTOR_FROM" >&2 ;;
  esac
done

evaluate() { # OUT BUCKET_EDGES CONCAT(yes|no) PACKAGES... [--NMT_EVAL_FLAG ...]
  local out=$1 edges=$2 concat=$3
  shift 3
  local packages=()
  while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do packages+=(--package "$dir/pkg/$1"); shift; done
  local concat_flag=()
  [ "$concat" = no ] && concat_flag=(--no-concat)
  echo "position-study: evaluating $out" >&2
  $bin/nmt-eval "${packages[@]}" --split test --beyond-input-limit --bucket-edges "$edges" \
    "${concat_flag[@]}" "${eval_flags[@]}" "$@" --out "$dir/$out" >&2
}

all=() short=()
for m in "${MODELS[@]}"; do all+=("$m.all"); short+=("$m.short"); done
evaluate eval-all 16,32,64 yes "${all[@]}"
evaluate eval-short "$cap,64" yes "${short[@]}"
for m in "${THIRDS_MODELS[@]}"; do
  evaluate "eval-thirds-$m" "$t1,$t2" no "$m.third1" "$m.third2" "$m.third3" "$m.all"
done

aware=()
for m in "${LENGTH_MODELS[@]}"; do aware+=("$m.all"); done
for from in auto source reference; do
  evaluate "eval-length-$from" 16,32,64 no "${aware[@]}" --target-length "$from"
done
python3 scripts/position_study.py length-encodings "$dir" "${STUDY_LENGTH_DOC:-$(dirname "$doc")/length-encodings.md}" \
  --steps "$steps" --size "$size" --models "${LENGTH_MODELS[@]}"

python3 scripts/position_study.py report "$dir" "$doc" --cap "$cap" --terciles "$t1" "$t2" \
  --steps "$steps" --size "$size" --models "${MODELS[@]}" --thirds-models "${THIRDS_MODELS[@]}"
echo "position-study: wrote $doc" >&2
exit
}
