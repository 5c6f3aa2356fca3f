#!/usr/bin/env bash
# Builds the server image from the top-level Dockerfile and translates through it, on a
# machine that cannot pull from public container registries: the base images are made from
# Debian's own packages (debootstrap), the builder gets this machine's Rust toolchain, and the
# image is built with podman. Where `podman run` is refused (no setrlimit in some sandboxes),
# the image's filesystem is mounted and its entrypoint started with chroot, as the non-root
# user the image declares, with the image's environment.
#
#   scripts/container-images.sh            # build, start, translate over HTTP, SIGTERM
#   KEEP=1 scripts/container-images.sh     # keep the base images and the built image
#   TARGET=cuda scripts/container-images.sh  # the CUDA image (onnxruntime-gpu); without a GPU
#                                            # its server falls back to CPU, which is checked
#
# Needs root, and apt packages podman, buildah, debootstrap (installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORK=${WORK:-/tmp/nmt-container}
PORT=${PORT:-18080}
TARGET=${TARGET:-cpu}
IMAGE=localhost/nmt-server:$TARGET
mkdir -p "$WORK"

for p in podman buildah debootstrap; do
  command -v "$p" >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap >/dev/null; break; }
done

base_image() { # name, extra packages
  local name=$1 include=$2 root="$WORK/rootfs-$1"
  if podman image exists "localhost/$name"; then return; fi
  echo "container-images: debootstrap $name" >&2
  rm -rf "$root"
  debootstrap --variant=minbase ${include:+--include="$include"} bookworm "$root" "$MIRROR" >/dev/null
  if [ "$name" = rust-bookworm ]; then
    # This machine's toolchain, as the official rust image lays it out.
    mkdir -p "$root/usr/local/cargo/bin"
    cp -a "$(rustc --print sysroot)" "$root/usr/local/rust"
    ln -sf /usr/local/rust/bin/cargo /usr/local/rust/bin/rustc "$root/usr/local/cargo/bin/"
  fi
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | podman import \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'CMD ["bash"]' - "localhost/$name" >/dev/null
  rm -rf "$root"
}
base_image debian-bookworm ""
base_image rust-bookworm "build-essential,ca-certificates,pkg-config"

echo "container-images: podman build" >&2
start=$(date +%s)
# The crate registry of this machine is mounted so that the build downloads nothing twice, and
# its CA bundle, which trusts whatever proxy HTTPS goes through here, for pip.
ca=()
[ -f /etc/ssl/certs/ca-certificates.crt ] && ca=(--volume /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt)
# Docker format: OCI images have no HEALTHCHECK.
podman build --format docker --isolation chroot "${ca[@]}" \
  --build-arg BUILDER_IMAGE=localhost/rust-bookworm \
  --build-arg RUNTIME_IMAGE=localhost/debian-bookworm \
  --volume "${CARGO_HOME:-$HOME/.cargo}/registry:/usr/local/cargo/registry" \
  --target "$TARGET" -t "$IMAGE" . >&2
echo "container-images: built in $(( $(date +%s) - start )) s; size $(podman image inspect $IMAGE --format '{{.Size}}') bytes" >&2

mnt=$(podman image mount $IMAGE)
cleanup() {
  [ -n "${server:-}" ] && kill -9 "$server" 2>/dev/null || true
  umount "$mnt/proc" 2>/dev/null || true
  podman image unmount $IMAGE >/dev/null || true
  [ -n "${KEEP:-}" ] || podman rmi -f $IMAGE >/dev/null 2>&1 || true
}
trap cleanup EXIT
user=$(podman image inspect $IMAGE --format '{{.Config.User}}')
mapfile -t envs < <(podman image inspect $IMAGE --format '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
entrypoint=$(podman image inspect $IMAGE --format '{{index .Config.Entrypoint 0}}')
uid=$(chroot "$mnt" id -u "$user"); gid=$(chroot "$mnt" id -g "$user")
echo "container-images: starting $entrypoint as $user ($uid) from the image" >&2
mount --bind /proc "$mnt/proc" 2>/dev/null || true
env -i "${envs[@]}" NMT_PORT="$PORT" NMT_GRPC_PORT=0 \
  chroot --userspec="$uid:$gid" "$mnt" "$entrypoint" > "$WORK/server.log" 2>&1 &
server=$!
for _ in $(seq 120); do
  curl -sf "localhost:$PORT/ready" >/dev/null && break
  sleep 1
done
curl -sf "localhost:$PORT/ready" >/dev/null || { cat "$WORK/server.log" >&2; echo "not ready" >&2; exit 1; }
answer=$(curl -sf "localhost:$PORT/translate" -H 'content-type: application/json' -d '{"text": "Jesus wept."}')
echo "container-images: $answer" >&2
echo "$answer" | grep -q '"text":"[^"]' || { echo "no translation" >&2; exit 1; }
if [ "$TARGET" = cuda ]; then
  # Without a GPU the server runs on CPU, so check here that the CUDA provider would load on a
  # host that has one: every library it links resolves in the image but the driver's
  # libcuda.so.1, which the host provides, and cuDNN is there for it to open.
  provider=/opt/onnxruntime/libonnxruntime_providers_cuda.so
  missing=$(env -i "${envs[@]}" chroot "$mnt" ldd "$provider" | grep "not found" | grep -v "libcuda.so.1" || true)
  [ -z "$missing" ] || { echo "container-images: $provider lacks: $missing" >&2; exit 1; }
  env -i "${envs[@]}" chroot "$mnt" bash -c 'ls /opt/nvidia/libcudnn.so.9' >/dev/null ||
    { echo "container-images: no cuDNN 9 in /opt/nvidia" >&2; exit 1; }
  echo "container-images: the CUDA provider's libraries resolve (libcuda.so.1 comes with the host's driver)" >&2
  grep -m1 "CUDA" "$WORK/server.log" >&2 || true
fi
# The image's own health check, run as the image runs it.
health=$(podman image inspect $IMAGE --format '{{index .Config.Healthcheck.Test 3}}')
env -i "${envs[@]}" NMT_PORT="$PORT" chroot --userspec="$uid:$gid" "$mnt" bash -c "$health"
echo "container-images: health check passed" >&2
kill -TERM "$server"
status=0; wait "$server" || status=$?
server=""
echo "container-images: SIGTERM -> exit $status" >&2
[ "$status" -eq 0 ]
echo "container-images: ok"
