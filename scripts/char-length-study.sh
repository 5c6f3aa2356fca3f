#!/usr/bin/env bash
# Lengths in characters measured (issue 31): one package on the test books with the default
# request, isometric requests (`target_chars` "source"), `target_chars` at the reference's
# characters, subtitles (`max_chars` at 0.8 x the reference's characters) and `max_chars` 42;
# written into docs/length-control.md between its `characters` markers (the nmt-eval reports
# under runs/char-length-study/).
#
#   scripts/char-length-study.sh PACKAGE [NMT_EVAL_FLAGS...]
#
# e.g. scripts/char-length-study.sh models/en-es-rel-ldpe --limit 150 (CHAR_STUDY_CORPUS sets
# the corpus, data/corpus by default; CHAR_STUDY_OUT the folder of the reports.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,11p "$0"; exit 2; }
package=$1
shift
source scripts/env.sh
# NMT_EVAL_BIN: an nmt-eval binary to use instead of building one.
eval_bin=${NMT_EVAL_BIN:-}
if [ -z "$eval_bin" ]; then
  cargo build --release -q -p nmt-eval
  eval_bin=target/release/nmt-eval
fi
corpus=${CHAR_STUDY_CORPUS:-data/corpus}
out=${CHAR_STUDY_OUT:-runs/char-length-study}
mkdir -p "$out"

run() { # NAME FLAGS...
  local name=$1
  shift
  echo "char-length-study: $name" >&2
  "$eval_bin" --package "$package" --corpus "$corpus" --split test --no-concat --out "$out/$name" "$@" "${EXTRA[@]}" >&2
}
EXTRA=("$@")

run default
run isometric --target-chars source
run chars.reference --target-chars reference
run subtitle.0.8 --max-chars reference --reference-length-scale 0.8
run chars42 --max-chars 42

# Beside a rule-based system where Debian's apertium-en-es is installed (apt-get install
# apertium-en-es): its outputs, as they come, on the same sources.
if command -v apertium > /dev/null; then
  head -n "$(wc -l < "$out/default/test.ref")" "$corpus/test.en" | apertium -u eng-spa > "$out/apertium.es"
fi
python3 -m nmt_tools.studies.char_length "$out" "$corpus/test.en" "$package"
