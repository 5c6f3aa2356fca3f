#!/usr/bin/env bash
# The first call of a CUDA lease (scripts/cuda-lease-pack.sh): keeps the CUDA provider in the
# machine's /tmp for the second call, and starts .lease/train's runs detached (setsid), so that
# they outlive this call and train while the second one brings the rest.
set -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rm -rf /tmp/lease && mkdir -p /tmp/lease/trainout
python3 -c 'import lzma, shutil
shutil.copyfileobj(lzma.open(".lease/libonnxruntime_providers_cuda.so.xz"), open("/tmp/lease/libonnxruntime_providers_cuda.so", "wb"))'
if [ -f .lease/train/jobs.txt ]; then
    # A copy of the checkout of its own: the second call replaces this one's.
    cp -r . /tmp/lease/repo && rm -rf /tmp/lease/repo/.lease && cp -r .lease/train/. /tmp/lease/repo/
    (cd /tmp/lease/repo && setsid nohup bash -c 'OUT=/tmp/lease/trainout MINUTES=${MINUTES:-6.5} KINDS=${KINDS:-best} \
        scripts/gpu-train-jobs.sh jobs.txt > /tmp/lease/train.log 2>&1; echo $? > /tmp/lease/train.rc' \
        > /dev/null 2>&1 < /dev/null &)
    sleep 10
    tail -n 2 /tmp/lease/trainout/*.train.log
fi
ls -l /tmp/lease
