#!/usr/bin/env bash
# Length control measured by one command (issue 31 point 4): every request kind on the test
# books into docs/length-control.md, each in its own section between markers:
#   - characters: the default, isometric, target_chars, subtitle and max_chars 42 requests beside
#     Apertium and the references (LC, BLEU, chrF, endings, cuts; scripts/char-length-study.sh);
#   - exact endings: exact mode at the reference's length (scripts/exact-ending-study.sh);
#   - predictors: the length predictors' errors and cost, from the packages' manifests;
#   - request kinds: throughput of each kind at 1 and 16 clients (nmt-bench --request-kinds).
#
#   scripts/length-control.sh [PACKAGE]   (default models/en-es-l10n)
#
# Settings (environment): LENGTH_CORPUS (default data/corpus-l10n), LENGTH_PREDICTOR_PACKAGES
# (more packages for the predictors' table; default models/en-es-rel-ldpe, the BERT one),
# LENGTH_BENCH_SECONDS (measured seconds per throughput cell, default 20), LENGTH_OUT (the
# reports, default runs/length-control). About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
package=${1:-models/en-es-l10n}
corpus=${LENGTH_CORPUS:-data/corpus-l10n}
out=${LENGTH_OUT:-runs/length-control}
seconds=${LENGTH_BENCH_SECONDS:-20}
read -r -a predictor_packages <<< "${LENGTH_PREDICTOR_PACKAGES:-models/en-es-rel-ldpe}"
bash scripts/setup.sh >&2
source scripts/env.sh
cargo build --release -q -p nmt-eval -p nmt-server -p nmt-bench
[ -f "$corpus/test.en" ] || { echo "length-control: no $corpus/test.en (docs/corpus.md builds it)" >&2; exit 2; }
mkdir -p "$out"

echo "length-control: characters" >&2
CHAR_STUDY_CORPUS=$corpus CHAR_STUDY_OUT=$out/characters NMT_EVAL_BIN=target/release/nmt-eval \
  bash scripts/char-length-study.sh "$package"
echo "length-control: exact endings" >&2
EXACT_STUDY_CORPUS=$corpus EXACT_STUDY_OUT=$out/exact NMT_EVAL_BIN=target/release/nmt-eval \
  bash scripts/exact-ending-study.sh "$package"
echo "length-control: predictors" >&2
packages=()
for p in "$package" "${predictor_packages[@]}"; do packages+=(--package "$p"); done
python3 -m nmt_tools.studies.length_control predictors "${packages[@]}"

echo "length-control: throughput by request kind" >&2
# The kinds the sections above measure, as a client sends them.
cat > "$out/request-kinds.txt" <<'EOF'
default {}
source {"target_length": "source"}
isometric {"target_chars": "source"}
subtitle-42 {"max_chars": 42}
exact-source {"target_length": "source", "length_mode": "exact"}
EOF
target/release/nmt-bench --request-kinds "$out/request-kinds.txt" --model-dir "$package" \
  --clients 1,16 --seconds "$seconds" --verses "$corpus/test.en" \
  --out-json "$out/request-kinds.json" --out-md "$out/request-kinds.md" >&2
python3 -m nmt_tools.studies.length_control throughput "$out/request-kinds.json" --package "$package"
echo "length-control: wrote docs/length-control.md" >&2
