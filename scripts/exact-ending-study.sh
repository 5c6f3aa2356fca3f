#!/usr/bin/env bash
# Exact lengths that end well measured (issue 31 point 3): one package on the test books at the
# reference's length in exact mode, with `--exact-plans` 0 (the count alone, as before), 1, 4
# (the default) and 10; written into docs/length-control.md between its `exact endings` markers
# (the nmt-eval reports under runs/exact-ending-study/).
#
#   scripts/exact-ending-study.sh PACKAGE [NMT_EVAL_FLAGS...]
#
# e.g. scripts/exact-ending-study.sh models/en-es-l10n --limit 150 (EXACT_STUDY_CORPUS sets the
# corpus, data/corpus-l10n by default; EXACT_STUDY_OUT the folder of the reports.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
package=$1
shift
source scripts/env.sh
# NMT_EVAL_BIN: an nmt-eval binary to use instead of building one.
eval_bin=${NMT_EVAL_BIN:-}
if [ -z "$eval_bin" ]; then
  cargo build --release -q -p nmt-eval
  eval_bin=target/release/nmt-eval
fi
corpus=${EXACT_STUDY_CORPUS:-data/corpus-l10n}
out=${EXACT_STUDY_OUT:-runs/exact-ending-study}
mkdir -p "$out"

for plans in 0 1 4 10; do
  echo "exact-ending-study: --exact-plans $plans" >&2
  "$eval_bin" --package "$package" --corpus "$corpus" --split test --no-concat --out "$out/plans$plans" \
    --target-length reference --length-mode exact --exact-plans "$plans" "$@" >&2
done

python3 -m nmt_tools.studies.exact_endings "$out" "$corpus/test.en" "$package"
