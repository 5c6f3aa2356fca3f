#!/usr/bin/env bash
# The second call of a CUDA lease (scripts/cuda-lease-pack.sh): unpacks the rest, evaluates on
# CUDA while the first call's trainings run (translations only: their speed then is not a
# benchmark), benchmarks once the trainings have ended, and leaves at most 8 files in $OUT
# (the device tool's limit): the trainings' weights and meta.tar, and cuda.tar.
set -u
START=$SECONDS
LIMIT=${LIMIT:-550}
results=/tmp/lease/results
rm -rf "$results" && mkdir -p "$results/cuda" /tmp/lease/pack
exec > >(tee "$results/cuda/lease.log") 2>&1
# Unpacked with Python's tarfile (the GPU image may lack xz); it prints the packages' folders.
eval "$(python3 - <<'PY'
import os, tarfile

def unpack(archive: str, into: str) -> str:
    with tarfile.open(archive) as t:
        # The "data" filter where this Python has it (3.12 and the later 3.11 releases).
        t.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        return os.path.join(into, t.getnames()[0].split("/")[0])

unpack(".leaseb/pack.tar.xz", "/tmp/lease/pack")
print(f"package={unpack('.leaseb/package.tar.xz', 'models')}")
int8 = ".leaseb/package-int8.tar.xz"
print(f"int8={unpack(int8, 'runs') if os.path.exists(int8) else ''}")
PY
)"
mkdir -p data/corpus && cp .leaseb/corpus/* data/corpus/
cp /tmp/lease/libonnxruntime_providers_cuda.so /tmp/lease/pack/ort/
check() { PACK=/tmp/lease/pack OUT=$results PACKAGE=$package FONT=.leaseb/DejaVuSans.ttf bash scripts/cuda-check.sh; }
STEPS=eval PACKAGE_INT8=$int8 check
if [ -f /tmp/lease/train.log ]; then
    echo "== waiting for the trainings ($((SECONDS - START)) s in)"
    while [ ! -f /tmp/lease/train.rc ] && [ $((SECONDS - START)) -lt $((LIMIT - 60)) ]; do sleep 5; done
    echo "trainings: rc $(cat /tmp/lease/train.rc 2>/dev/null || echo 'still running'), $((SECONDS - START)) s in"
    cat /tmp/lease/train.log
fi
left=$((LIMIT - 15 - (SECONDS - START)))
# Six cases, each gets its share of what is left; none while a training still holds the GPU.
if [ ! -f /tmp/lease/train.log ] || [ -f /tmp/lease/train.rc ]; then
    [ "$left" -gt 60 ] && BENCH_SECONDS=$((left / 6)) STEPS=bench check
fi
cp /tmp/lease/trainout/* "$OUT/" 2>/dev/null
(cd "$results" && tar -cf "$OUT/cuda.tar" cuda)
ls -l "$OUT"
