#!/usr/bin/env bash
# The server's CUDA path on a lent GPU machine, measured beside its CPU path on the same machine
# (issue 32 point 6). That machine has the NVIDIA runtime wheels (PyTorch's: CUDA 13, cuDNN 9,
# cuBLAS) but no Rust toolchain and no onnxruntime-gpu, so the binaries built here and the
# ONNX Runtime libraries of the `onnxruntime-gpu` wheel travel with the call:
#
#   PACK=/tmp/cudapack OUT=$OUT scripts/cuda-check.sh
#
# PACK holds ort/ (libonnxruntime.so.1.31.1, libonnxruntime_providers_{cuda,shared}.so) and bin/
# (nmt-server, nmt-eval, nmt-bench-worker). Also read: PACKAGE (default models/en-es-l10n),
# data/corpus/test.{en,es}, VERSES_ONE (one client's verses, default the first 150 test verses,
# as docs/benchmarks/ctranslate2-one-stream.md) and VERSES_MANY (64 clients', default the test
# books). STEPS says which parts run (default "eval bench"): a lease that shares the GPU with
# training runs `eval` (translations, timing not reported) while it trains and `bench` after.
# PACKAGE_INT8, when set, is also evaluated on CUDA (its quantized products as ONNX Runtime's
# own nodes there). FONT: the plots' TrueType font (nmt-eval's --font; the GPU image has none).
# BENCH_SECONDS caps each benchmark case. Writes OUT/cuda/: the CUDA translations of
# the test books (nmt-eval, to compare with the CPU's here), the log, and one JSON line per
# benchmark pass, labelled.
set -uo pipefail
PACK=$(realpath "${PACK:?folder with ort/ and bin/}")
OUT=$(realpath "${OUT:?folder for the results}")
PACKAGE=${PACKAGE:-models/en-es-l10n}
PACKAGE_INT8=${PACKAGE_INT8:-}
VERSES_MANY=${VERSES_MANY:-data/corpus/test.en}
STEPS=${STEPS:-eval bench}
BENCH_SECONDS=${BENCH_SECONDS:-150}
font=()
[ -n "${FONT:-}" ] && font=(--font "$(realpath "$FONT")")
cd "$(dirname "$0")/.."
results=$OUT/cuda
mkdir -p "$results"
exec > >(tee -a "$results/log.txt") 2>&1
if [ -z "${VERSES_ONE:-}" ]; then
    VERSES_ONE=$results/verses150.en
    head -n 150 data/corpus/test.en > "$VERSES_ONE"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# The CPU as every benchmark report here names it (nmt_tools.machine: model and instruction sets).
(cd tools && python3 -c 'import os; from nmt_tools.machine import cpu_summary; print(f"CPU: {cpu_summary()}, {os.cpu_count()} cores")')
# The NVIDIA runtime wheels beside PyTorch, found where Python keeps them.
nvidia_libs=$(python3 -c 'import nvidia, os, glob
roots = list(nvidia.__path__)
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "cu*", "lib"))})))' 2>/dev/null)
export LD_LIBRARY_PATH=$PACK/ort:$nvidia_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export ORT_DYLIB_PATH=$PACK/ort/libonnxruntime.so.1.31.1
echo "== libraries the CUDA provider links and does not find:"
ldd "$PACK/ort/libonnxruntime_providers_cuda.so" | grep 'not found' || echo "(none)"
bin=$PACK/bin

evaluate() { # LABEL PACKAGE
    echo "== the test books on CUDA, $1 (nmt-eval, batches as it makes them)"
    SECONDS=0
    "$bin/nmt-eval" --package "$2" --split test --no-concat --device cuda --python python3 \
        --bootstrap-samples 0 "${font[@]}" --out "$results/eval-$1" 2>&1 | grep -v '^\s*$' | tail -n 20
    echo "nmt-eval $1: ${SECONDS} s"
}

bench() { # LABEL VERSES CLIENTS SERVER_ARGS...
    local label=$1 verses=$2 clients=$3
    shift 3
    local args=()
    for a in "$@"; do args+=(--server-arg="$a"); done
    echo "== $label"
    printf 'run\nrun\n' | timeout "$BENCH_SECONDS" "$bin/nmt-bench-worker" --verses "$verses" --warmup 16 http \
        --package "$PACKAGE" --server-bin "$bin/nmt-server" --clients "$clients" \
        --server-log "$results/server-$label.log" "${args[@]}" \
        | while read -r line; do echo "$label $line"; done | tee -a "$results/passes.txt"
    grep -m3 -E 'execution_provider=|CUDA was asked|attention_reads' "$results/server-$label.log" | cut -c1-600 || true
}
if [[ " $STEPS " == *" eval "* ]]; then
    evaluate cuda "$PACKAGE"
    [ -n "$PACKAGE_INT8" ] && evaluate cuda-int8 "$PACKAGE_INT8"
fi
[[ " $STEPS " == *" bench "* ]] || exit 0
bench cuda-1-client "$VERSES_ONE" 1 --device cuda
bench cuda-64-clients "$VERSES_MANY" 64 --device cuda
# The batch cap is sized for two CPU cores; a GPU may want every client in one batch.
bench cuda-64-clients-batch-64 "$VERSES_MANY" 64 --device cuda --max-batch-size 64 --max-batch-tokens 32768
bench cpu-1-client "$VERSES_ONE" 1 --device cpu
bench cpu-64-clients "$VERSES_MANY" 64 --device cpu
bench cpu-64-clients-8-workers "$VERSES_MANY" 64 --device cpu --model-workers 8
nvidia-smi --query-gpu=memory.used --format=csv,noheader
ls -l "$results"
