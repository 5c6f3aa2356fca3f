#!/usr/bin/env bash
# The papers' length findings on our corpus: absolute vs relative vs recurrent positions on
# inputs longer than those seen in training. Trains every model of the study, exports it,
# evaluates it through the serving engine (nmt-eval) and writes
# docs/experiments/position-study.md with its plots. Re-runnable, and made to span sessions
# on machines that keep nothing but the repository: each finished model leaves its training
# report and its translations of the test sets (nmt-eval's decoded.json, ~100 KB) in
# docs/experiments/position-study/runs/<name>/, and is then never trained again; the tables
# are scored from those files. An unfinished model resumes from its last checkpoint while
# the machine keeps it. An evaluation whose command, translations, test set and scorer are
# unchanged since it last finished is not run again, so a re-run after one more model
# rescores only the tables that model is in. The pages' prose, the papers' numbers and the
# findings' wording are Markdown templates beside the record
# (docs/experiments/position-study/*.template.md); nmt_tools.studies.position_study fills them in.
#
#   scripts/position-study.sh [--quick | --full]
#
# Settings (environment):
#   STUDY_DIR    where runs, packages and reports go (default runs/position-study)
#   STUDY_STEPS  optimizer steps per model, the same for every model (default 1500)
#   STUDY_CAP    source subwords of the short-only training data, (b) (default 32)
#   STUDY_JOBS   models trained at once, one core each (default 2)
#   STUDY_DOC    the write-up (default docs/experiments/position-study.md; Oka et al.'s table
#                of length encodings goes beside it, length-encodings.md)
#   STUDY_RECORD where each finished model's training report and translations are kept
#                (default docs/experiments/position-study; commit it)
#   STUDY_ONLY   train only these runs, in this order (names as in runs_list,
#                space-separated, e.g. "transformer.all rel-transformer.all"); the tables
#                still show every recorded one
#   STUDY_REPORT_ONLY=1  train nothing: write the tables from the models recorded so far
#                (=length: only Oka et al.'s table of length encodings)
#   STUDY_SHORT_TOKENIZER  --full: the tokenizer of the runs on short sources, for models
#                trained on another corpus (default the Bible's, data/tokenizer.json; the
#                localization corpus's: models/en-es-l10n/tokenizer.json); the thirds, whose
#                terciles come from the Bible, keep the Bible's
#   STUDY_TEMPLATE_OVER  --full: blocks that replace those of the page's template
#                (position-study/position-study-full.template.md), for another budget's intro
#   STUDY_PREDICTOR_FROM  the package whose length predictor the LDPE/LRPE packages get
#                (default models/en-es-rel-ldpe)
# --quick: tiny models, 40 steps, 60 test verses: checks the pipeline in minutes, writes to
# runs/position-study-quick and its own doc and record there, never to docs/.
# --full: the shipped size (d_model 256), trained on a lent GPU rather than here: the
# Transformer, the Rel-Transformer and the RR-Transformer on sources of at most STUDY_CAP
# subwords, and the first two on the shortest and the longest third, each imported from the folder
# scripts/gpu-train-jobs.sh filled (STUDY_GPU_PARTS, required; its job file:
# docs/experiments/position-study-full/gpu-jobs.txt; STUDY_GPU_KIND=best imports the runs'
# best points, trained with --eval-steps and brought back with KINDS=best). Writes
# docs/experiments/position-study-full.md, with the -small results beside it.
set -euo pipefail
# Braces: bash reads the whole script before running it, so the script can be edited while a
# study of several hours runs.
{
cd "$(dirname "$0")/.."

tier=small
case "${1:-}" in
  --quick) tier=quick ;;
  --full) tier=full ;;
esac
if [ $tier = quick ]; then
  dir=${STUDY_DIR:-runs/position-study-quick}
  steps=${STUDY_STEPS:-40}
  size=tiny
  eval_flags=(--bootstrap-samples 100)
  limit_flags="--limit 60"
  doc=${STUDY_DOC:-$dir/position-study.md}
  record=${STUDY_RECORD:-$dir/record}
elif [ $tier = full ]; then
  dir=${STUDY_DIR:-runs/position-study-full}
  steps=${STUDY_STEPS:-2400}
  size=full
  eval_flags=()
  limit_flags=""
  doc=${STUDY_DOC:-docs/experiments/position-study-full.md}
  record=${STUDY_RECORD:-docs/experiments/position-study-full}
  gpu_parts=${STUDY_GPU_PARTS:-}
  gpu_kind=${STUDY_GPU_KIND:-ema}
else
  dir=${STUDY_DIR:-runs/position-study}
  steps=${STUDY_STEPS:-1500}
  size=small
  eval_flags=()
  limit_flags=""
  doc=${STUDY_DOC:-docs/experiments/position-study.md}
  record=${STUDY_RECORD:-docs/experiments/position-study}
fi
# The Bible's tokenizer. The -small study was recorded with the shipped Bible model's
# (`nmt-train tokenizer` has changed since: digits and placeholders split off, NFC), and its
# length-aware packages take that model's length predictor, which counts in it; the full tier's
# runs trained with data/tokenizer.json as written today (kept beside their record).
bible_tokenizer=models/en-es-rel-ldpe/tokenizer.json
short_tokenizer=$bible_tokenizer
if [ $tier = full ]; then
  bible_tokenizer=data/tokenizer.json
  short_tokenizer=${STUDY_SHORT_TOKENIZER:-$bible_tokenizer}
fi
cap=${STUDY_CAP:-32}
jobs=${STUDY_JOBS:-2}

# Neishi & Yoshinaga's and Rosendahl et al.'s systems, Chen et al.'s RPEHead, and the RNN
# baseline; the Transformer (sinusoidal) is the baseline of every paired bootstrap.
MODELS=(transformer transformer-learned rel-transformer rnn-transformer rr-transformer lstm-pe rpe-head rnn-nmt)
THIRDS_MODELS=(transformer rel-transformer)
THIRDS=(1 2 3)
[ $tier = full ] && { MODELS=(transformer rel-transformer rr-transformer); THIRDS=(1 3); }
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
mkdir -p "$dir/runs" "$dir/pkg"

# The training data's source-length terciles (subwords, EOS not counted): the bands of the
# short / middle / long thirds.
read -r t1 t2 < <(python3 -m nmt_tools.studies.position_study terciles "$bible_tokenizer" data/corpus/train.en)
echo "position-study: source terciles $t1 / $t2, short-only cap $cap, $steps steps, $size models" >&2

# One line per run: NAME PRESET EXTRA_TRAIN_FLAGS...
runs_list() {
  local preset
  for m in "${MODELS[@]}"; do
    preset=$(preset_of "$m")
    [ $tier = full ] || echo "$m.all $preset"
    echo "$m.short $preset --max-source-len $cap"
  done
  if [ $tier != full ]; then
    for m in "${LENGTH_MODELS[@]}"; do
      echo "$m.all $(preset_of "$m")"
    done
  fi
  for m in "${THIRDS_MODELS[@]}"; do
    preset=$(preset_of "$m")
    for k in "${THIRDS[@]}"; do
      case $k in
        1) echo "$m.third1 $preset --max-source-len $t1" ;;
        2) echo "$m.third2 $preset --min-source-len $((t1 + 1)) --max-source-len $t2" ;;
        3) echo "$m.third3 $preset --min-source-len $((t2 + 1))" ;;
      esac
    done
  done
}
preset_of() { # MODEL: its preset at the tier's size (the full size has no suffix)
  if [ $tier = full ]; then echo "$1"; else echo "$1-$size"; fi
}

# The length asks a model's translations are kept for: what a request without one gets,
# and for the length-aware models the predicted, source and reference lengths.
asks_of() { # NAME
  case " $LENGTH_RUNS " in
    *" $1 "*) echo "default auto source reference" ;;
    *) echo "default" ;;
  esac
}

tokenizer_of() { # NAME
  case "$1" in
    *.short) echo "$short_tokenizer" ;;
    *) echo "$bible_tokenizer" ;;
  esac
}

budget_spent() { # REPORT_JSON: the run reached the study's budget
  [ -f "$1" ] && python3 - "$1" "$steps" <<'EOF'
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["state"]["step"] >= int(sys.argv[2]) else 1)
EOF
}

# Whether NAME's training report (at this budget) and translations are in the record.
recorded() { # NAME
  local r=$record/runs/$1 ask
  budget_spent "$r/report.json" || return 1
  for ask in $(asks_of "$1"); do [ -f "$r/decoded-$ask.json" ] || return 1; done
}

# Trains NAME, exports it, translates the test sets with it (nmt-eval, through the serving
# engine) and keeps the training report and the translations in the record.
train_one() { # NAME PRESET FLAGS...
  local name=$1 preset=$2
  shift 2
  if recorded "$name"; then
    echo "position-study: $name recorded" >&2
    return 0
  fi
  local out=$dir/runs/$name pkg=$dir/pkg/$name
  if [ $tier = full ] && ! budget_spent "$out/report.json"; then
    # Trained on a GPU (the flags above are the job file's too); the config is the preset's.
    [ -n "$gpu_parts" ] || { echo "position-study: $name not trained: set STUDY_GPU_PARTS" >&2; return 1; }
    $bin/nmt-train train --preset "$preset" --out "$dir/config/$name" --max-steps 0 \
      --tokenizer "$(tokenizer_of "$name")" --quiet > /dev/null
    python3 -m nmt_tools.studies.position_study import-gpu --parts "$gpu_parts" --name "$name" \
      --config "$dir/config/$name/last/config.json" --out "$out" --kind "$gpu_kind" >&2
    budget_spent "$out/report.json" || echo "position-study: $name stopped short of $steps steps" >&2
  elif ! budget_spent "$out/report.json"; then
    echo "position-study: training $name ($preset $*)" >&2
    mkdir -p "$out"
    # One core per run: two runs side by side use this machine better than one run on two.
    RAYON_NUM_THREADS=1 $bin/nmt-train train --preset "$preset" --out "$out" --resume \
      --batch-tokens 3000 --lr 1e-3 --warmup-steps 400 --max-steps "$steps" \
      --eval-every 250 --save-every 50 --snapshot-every 1000000 --keep-snapshots 1 \
      --dev-limit 200 --max-len 128 --quiet "$@" > "$out/report.json.tmp" 2> "$out/train.log"
    mv "$out/report.json.tmp" "$out/report.json"
  fi
  rm -rf "$pkg"
  $bin/nmt-export --checkpoint "$out/last" --tokenizer "$(tokenizer_of "$name")" --name "$name" \
    --out "$pkg" >&2
  case " $LENGTH_RUNS " in
    *" $name "*) $bin/nmt-export length-predictor --package "$pkg" --from-package "$PREDICTOR_FROM" >&2 ;;
  esac
  # The thirds are scored on single verses only; every other model on the long inputs too.
  local concat=() ask ask_flags
  case "$name" in *.third*) concat=(--no-concat) ;; esac
  mkdir -p "$record/runs/$name"
  for ask in $(asks_of "$name"); do
    ask_flags=()
    [ "$ask" = default ] || ask_flags=(--target-length "$ask")
    echo "position-study: translating with $name ($ask length)" >&2
    $bin/nmt-eval --package "$pkg" --split test --beyond-input-limit --bootstrap-samples 100 \
      "${concat[@]}" "${ask_flags[@]}" $limit_flags --out "$dir/decode/$name-$ask" >&2
    cp "$dir/decode/$name-$ask/$name/decoded.json" "$record/runs/$name/decoded-$ask.json"
  done
  cp "$out/report.json" "$record/runs/$name/report.json"
}
LENGTH_RUNS=$(printf '%s.all ' "${LENGTH_MODELS[@]}")
export -f train_one recorded budget_spent asks_of tokenizer_of
export dir steps bin record limit_flags LENGTH_RUNS PREDICTOR_FROM tier gpu_parts gpu_kind short_tokenizer bible_tokenizer

if [ -z "${STUDY_REPORT_ONLY:-}" ]; then
  # STUDY_ONLY's order is the training order, so a session can put first what it needs first.
  if [ -n "${STUDY_ONLY:-}" ]; then
    for only in $STUDY_ONLY; do
      runs_list | awk -v n="$only" '$1 == n' | grep . || { echo "position-study: no run named $only" >&2; exit 2; }
    done
  else
    runs_list
  fi | xargs -P "$jobs" -L 1 bash -c 'set -euo pipefail; train_one "$@"' _
fi

evaluate() { # OUT BUCKET_EDGES CONCAT(yes|no) [--from RECORD] [--ask ASK] RUNS... [--NMT_EVAL_FLAG ...]
  local out=$1 edges=$2 concat=$3
  shift 3
  local decoded=()
  local ask=default from=$record
  [ "${1:-}" = --from ] && { from=$2; shift 2; }
  [ "${1:-}" = --ask ] && { ask=$2; shift 2; }
  # Models not yet recorded are left out: the tables show what the record holds so far.
  while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do
    [ -f "$from/runs/$1/decoded-$ask.json" ] && decoded+=("$from/runs/$1/decoded-$ask.json")
    shift
  done
  if [ ${#decoded[@]} = 0 ]; then
    echo "position-study: $out skipped, none of its models recorded yet" >&2
    return 0
  fi
  local concat_flag=() packages=() file
  [ "$concat" = no ] && concat_flag=(--no-concat)
  for file in "${decoded[@]}"; do packages+=(--package "$file"); done
  local command=("$bin/nmt-eval" "${packages[@]}" --split test --beyond-input-limit
    --bucket-edges "$edges" "${concat_flag[@]}" "${eval_flags[@]}" $limit_flags "$@" --out "$dir/$out")
  # An evaluation is a function of its command, its translations, the test set and the
  # scorer: when none changed since the last one finished, its report stands (a full pass
  # takes ~27 min on 2 cores).
  local inputs
  inputs=$(printf '%s\n' "${command[@]}" "$scored_by"; sha256sum "${decoded[@]}")
  if [ -f "$dir/$out/report.json" ] && [ "$(cat "$dir/$out/inputs.txt" 2>/dev/null)" = "$inputs" ]; then
    echo "position-study: $out is up to date" >&2
    return 0
  fi
  rm -f "$dir/$out/inputs.txt"
  echo "position-study: evaluating $out" >&2
  "${command[@]}" >&2
  printf '%s\n' "$inputs" > "$dir/$out/inputs.txt"
}

scored_by=$(sha256sum "$bin/nmt-eval" data/corpus/test.en data/corpus/test.es data/corpus/test-concat.tsv
  python3 -c 'import sacrebleu; print("sacrebleu", sacrebleu.__version__)')
all=() short=()
for m in "${MODELS[@]}"; do all+=("$m.all"); short+=("$m.short"); done
if [ "${STUDY_REPORT_ONLY:-}" != length ]; then
  evaluate eval-all 16,32,64 yes "${all[@]}"
  evaluate eval-short "$cap,64" yes "${short[@]}"
  for m in "${THIRDS_MODELS[@]}"; do
    evaluate "eval-thirds-$m" "$t1,$t2" no "$m.third1" "$m.third2" "$m.third3" "$m.all"
  done
  # Across families, for the paired bootstrap: the models trained on the same third, the
  # Transformer first.
  for k in "${THIRDS[@]}"; do
    evaluate "eval-third$k" "$t1,$t2" no $(printf "%s.third$k " "${THIRDS_MODELS[@]}")
  done
fi

if [ $tier = full ]; then
  # The same models at -small, from that study's record, scored the same way, to set beside.
  evaluate eval-short-small "$cap,64" yes --from docs/experiments/position-study "${short[@]}"
  # Both sizes in one plot, in finer buckets: nmt-eval draws a curve per package name, so the
  # -small translations go in renamed (NAME.small).
  sizes=()
  for r in "${short[@]}"; do
    small=docs/experiments/position-study/runs/$r/decoded-default.json
    full=$record/runs/$r/decoded-default.json
    [ -f "$small" ] && [ -f "$full" ] || continue
    python3 -m nmt_tools.studies.position_study relabel "$small" "$dir/sizes/$r.small.json" "$r.small"
    sizes+=(--package "$full" --package "$dir/sizes/$r.small.json")
  done
  if [ ${#sizes[@]} -gt 0 ]; then
    echo "position-study: evaluating eval-short-sizes (the plot of both sizes)" >&2
    "$bin/nmt-eval" "${sizes[@]}" --split test --beyond-input-limit --bucket-edges 16,32,48,64,96 \
      --no-concat --bootstrap-samples 0 --out "$dir/eval-short-sizes" >&2
  fi
  python3 -m nmt_tools.studies.position_study report "$dir" "$doc" --record "$record" --cap "$cap" \
    --terciles "$t1" "$t2" --steps "$steps" --size "$size" --models "${MODELS[@]}" \
    --thirds-models "${THIRDS_MODELS[@]}" --beside "$dir/eval-short-small" \
    --template docs/experiments/position-study/position-study-full.template.md \
    ${STUDY_TEMPLATE_OVER:+--template-over "$STUDY_TEMPLATE_OVER"}
  echo "position-study: wrote $doc" >&2
  exit
fi

aware=()
for m in "${LENGTH_MODELS[@]}"; do aware+=("$m.all"); done
for from in auto source reference; do
  evaluate "eval-length-$from" 16,32,64 no --ask "$from" "${aware[@]}" --target-length "$from"
done
python3 -m nmt_tools.studies.position_study length-encodings "$dir" --record "$record" "${STUDY_LENGTH_DOC:-$(dirname "$doc")/length-encodings.md}" \
  --steps "$steps" --size "$size" --models "${LENGTH_MODELS[@]}"

[ "${STUDY_REPORT_ONLY:-}" = length ] && exit
python3 -m nmt_tools.studies.position_study report "$dir" "$doc" --record "$record" --cap "$cap" --terciles "$t1" "$t2" \
  --steps "$steps" --size "$size" --models "${MODELS[@]}" --thirds-models "${THIRDS_MODELS[@]}"
echo "position-study: wrote $doc" >&2
exit
}
