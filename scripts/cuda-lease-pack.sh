#!/usr/bin/env bash
# Packs what a lent H100 (or H200) needs for scripts/cuda-check.sh, and optionally GPU trainings
# beside it, into two folders that each fit the device tool's 64 MiB a call (docs/benchmarks/cuda.md,
# "Running it again"):
#
#   .lease/   the CUDA provider cut to the GPU's architecture (nmt_tools.device.cuda_pack: 52 MB
#             as xz instead of 186) and, with JOBS, a gpu-train-jobs.sh file and its data
#   .leaseb/  ONNX Runtime's other two libraries and the stripped binaries (18 MB as xz),
#             PACKAGE and PACKAGE_INT8 (tar.xz), the test books and a font for nmt-eval's plots
#
# Then, with models/ and docs/experiments/ moved out of the checkout (the tracked tree is
# 114 MB; without them 5 MB), two calls back to back (the machine goes back after 30 s idle):
#   run "bash scripts/cuda-lease-start.sh"  carry [".lease"]
#   run "bash scripts/cuda-lease-finish.sh" carry [".leaseb"]   (timeout_s 590)
#
#   JOBS          a scripts/gpu-train-jobs.sh file to train while the check runs (optional)
#   TRAIN_FILES   paths (relative to the repository) its runs read, copied along (e.g. gpu)
#   PACKAGE       default models/en-es-l10n;  PACKAGE_INT8  optional, e.g. runs/l10n-int8
#   ARCH          the GPU's architecture, default 90 (H100 and H200)
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=${PACKAGE:-models/en-es-l10n}
PACKAGE_INT8=${PACKAGE_INT8:-}
ARCH=${ARCH:-90}
ORT_VERSION=1.31.1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf .lease .leaseb
mkdir -p .lease .leaseb/corpus "$work/pack/bin" "$work/pack/ort"

python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$work" "onnxruntime-gpu==$ORT_VERSION"
(cd "$work" && python3 -m zipfile -e onnxruntime_gpu-*.whl wheel)
capi=$work/wheel/onnxruntime/capi
python3 -m nmt_tools.device.cuda_pack --library "$capi/libonnxruntime_providers_cuda.so" --arch "$ARCH" \
    --out .lease/libonnxruntime_providers_cuda.so.xz
cp "$capi/libonnxruntime.so.$ORT_VERSION" "$capi/libonnxruntime_providers_shared.so" "$work/pack/ort/"
for b in nmt-server nmt-eval nmt-bench-worker nmt-translate; do strip -o "$work/pack/bin/$b" "target/release/$b"; done
tar -C "$work/pack" -cf - bin ort | xz -6 -T2 > .leaseb/pack.tar.xz
tar -C "$(dirname "$PACKAGE")" -cf - "$(basename "$PACKAGE")" | xz -6 -T2 > .leaseb/package.tar.xz
if [ -n "$PACKAGE_INT8" ]; then
    tar -C "$(dirname "$PACKAGE_INT8")" -cf - "$(basename "$PACKAGE_INT8")" | xz -6 -T2 > .leaseb/package-int8.tar.xz
fi
cp data/corpus/test.en data/corpus/test.es .leaseb/corpus/
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf .leaseb/
if [ -n "${JOBS:-}" ]; then
    mkdir -p .lease/train
    cp "$JOBS" .lease/train/jobs.txt
    for path in ${TRAIN_FILES:-}; do cp -r --parents "$path" .lease/train/; done
fi
tracked=$(git ls-files -z -- . ':!models' ':!docs/experiments' | xargs -0 du -cb | tail -n 1 | cut -f1)
for folder in .lease .leaseb; do
    echo "$folder: $(du -sb "$folder" | cut -f1) bytes, plus $tracked of the tracked tree without models/ and docs/experiments/ (64 MiB = 67108864 a call)"
done
