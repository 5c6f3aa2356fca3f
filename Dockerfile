# nmt-server with the shipped model, built from source.
#
#   podman build -t nmt-server .                  # CPU image (the default target)
#   podman build --target cuda -t nmt-server:cuda .   # CUDA image (onnxruntime-gpu)
#   podman run -p 8080:8080 -p 50051:50051 nmt-server
#
# The base images are build arguments so that the image can be built where public registries
# cannot be reached, from base images made from Debian's own packages
# (scripts/container-images.sh does that and tests the result).
ARG BUILDER_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

# ---- build: the two binaries -------------------------------------------------------------
FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY model-package model-package
COPY train train
COPY model-export model-export
COPY engine engine
COPY server server
COPY translate translate
COPY eval eval
COPY testkit testkit
COPY bench bench
COPY tests tests
COPY proto proto
RUN cargo build --release --locked -p nmt-server -p nmt-translate \
 && install -m 0755 target/release/nmt-server target/release/nmt-translate /usr/local/bin/

# ---- assets: ONNX Runtime from its PyPI wheel, the length predictor's BERT files ---------
FROM ${RUNTIME_IMAGE} AS assets
ARG ORT_WHEEL=onnxruntime==1.31.1
# A CA bundle for pip where HTTPS goes through an intercepting proxy (a build-time mount).
ARG PIP_CERT=
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /venv && /venv/bin/pip install -q --no-cache-dir "${ORT_WHEEL}"
ENV PATH=/venv/bin:$PATH
WORKDIR /app
COPY models models
COPY scripts/install-length-predictor.sh scripts/
RUN bash scripts/install-length-predictor.sh \
 && mkdir -p /opt/onnxruntime \
 && cp /venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1 \
       /venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime_providers_shared.so \
       /opt/onnxruntime/

# ---- cpu: the runtime image -------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS cpu
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin nmt
COPY --from=build /usr/local/bin/nmt-server /usr/local/bin/nmt-translate /usr/local/bin/
COPY --from=assets /opt/onnxruntime /opt/onnxruntime
COPY --from=assets --chown=root:root /app/models /app/models
WORKDIR /app
USER nmt
ENV ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1 \
    NMT_MODEL_DIR=/app/models/en-es-l10n,/app/models/en-es-rel-ldpe \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=8080 \
    NMT_GRPC_PORT=50051 \
    NMT_LOG_FORMAT=json
EXPOSE 8080 50051
# bash's /dev/tcp: no curl in a slim image. /ready is 200 once the models are warm.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${NMT_PORT} && printf 'GET /ready HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
# Exec form: the server is PID 1 and gets SIGTERM itself, which drains requests in flight.
ENTRYPOINT ["/usr/local/bin/nmt-server"]

# ---- cuda: the same with onnxruntime-gpu and the NVIDIA runtime wheels it loads ----------
FROM ${RUNTIME_IMAGE} AS cuda-assets
ARG PIP_CERT=
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# onnxruntime-gpu 1.31.1 is built for CUDA 13: its `cuda` and `cudnn` extras name the runtime
# wheels it loads; cuBLAS 13, which its CUDA provider links, is not among them. (The CUDA 12
# wheels install without complaint and leave the provider unloadable, libcublasLt.so.13
# missing, so the server quietly ran on CPU: scripts/container-images.sh now checks.)
RUN python3 -m venv /venv \
 && /venv/bin/pip install -q --no-cache-dir "onnxruntime-gpu[cuda,cudnn]==1.31.1" \
      "nvidia-cublas~=13.0" \
 && mkdir -p /opt/onnxruntime /opt/nvidia \
 && cp /venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime*.so* /opt/onnxruntime/ \
 && cp -a /venv/lib/python3*/site-packages/nvidia/*/lib/. /opt/nvidia/

FROM cpu AS cuda
COPY --from=cuda-assets /opt/onnxruntime /opt/onnxruntime
COPY --from=cuda-assets /opt/nvidia /opt/nvidia
ENV LD_LIBRARY_PATH=/opt/nvidia:/opt/onnxruntime \
    NMT_DEVICE=auto

# The default target is the CPU image.
FROM cpu
