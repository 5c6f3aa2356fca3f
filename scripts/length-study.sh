#!/usr/bin/env bash
# Length control measured as Oka et al. measure it, written to docs/length-control.md (and
# the nmt-eval reports under runs/length-study/): a baseline package without length
# encodings and a length-aware package, on the test books, with the length from the
# predictor, from the source and from the reference (BLEU, LR, VAR); soft and exact modes;
# the subtitle case (0.8 x the reference, and max_chars 42); soft mode's pull toward the asked
# length (nmt-server --length-pull) swept; examples of one verse at three lengths.
#
#   scripts/length-study.sh BASELINE_PACKAGE LENGTH_AWARE_PACKAGE [NMT_EVAL_FLAGS...]
#
# e.g. scripts/length-study.sh runs/pkg/rel-transformer models/en-es-rel-ldpe --limit 50
# (LENGTH_STUDY_OUT sets the folder of the nmt-eval reports; LENGTH_STUDY_NOTE, a note printed
# under the title.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
baseline=$1 aware=$2
shift 2
source scripts/env.sh
# NMT_EVAL_BIN: an nmt-eval binary to use instead of building one.
eval_bin=${NMT_EVAL_BIN:-}
if [ -z "$eval_bin" ]; then
  cargo build --release -q -p nmt-eval
  eval_bin=target/release/nmt-eval
fi
out=${LENGTH_STUDY_OUT:-runs/length-study}
mkdir -p "$out"

run() { # NAME PACKAGE FLAGS...
  local name=$1 package=$2
  shift 2
  echo "length-study: $name" >&2
  "$eval_bin" --package "$package" --no-concat --out "$out/$name" "$@" "${EXTRA[@]}" >&2
}
EXTRA=("$@")
PULLS="0 1 2 4 8"

run baseline.free "$baseline"
run baseline.reference.exact "$baseline" --target-length reference --length-mode exact
run baseline.subtitle.exact "$baseline" --target-length reference --reference-length-scale 0.8 --length-mode exact
run baseline.chars42.exact "$baseline" --max-chars 42 --length-mode exact
run aware.auto "$aware" --target-length auto
run aware.source "$aware" --target-length source
run aware.reference "$aware" --target-length reference
run aware.reference.exact "$aware" --target-length reference --length-mode exact
run aware.subtitle "$aware" --target-length reference --reference-length-scale 0.8
run aware.longer "$aware" --target-length reference --reference-length-scale 1.2
run aware.chars42 "$aware" --max-chars 42
# Soft mode's pull toward the asked length (nmt-server --length-pull), swept.
for pull in $PULLS; do
  NMT_LENGTH_PULL=$pull run "aware.reference.pull$pull" "$aware" --target-length reference
  NMT_LENGTH_PULL=$pull run "aware.subtitle.pull$pull" "$aware" --target-length reference --reference-length-scale 0.8
done

# The page's section on lengths in characters is scripts/char-length-study.sh's: kept as it is.
characters=$(sed -n '/<!-- characters: begin/,/<!-- characters: end -->/p' docs/length-control.md)
python3 -m nmt_tools.studies.length_study "$out" "$baseline" "$aware" $PULLS > docs/length-control.md
if [ -n "$characters" ]; then printf '\n%s\n' "$characters" >> docs/length-control.md; fi
echo "length-study: wrote docs/length-control.md" >&2
