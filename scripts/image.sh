#!/usr/bin/env bash
# Builds Herald's container image without a Docker daemon, with buildah (docs/deploy.md,
# "Container image"): `FROM scratch` plus only what the binary needs (distroless-style):
#   /herald                     the binary, debug info stripped (symbols kept)
#   the shared libraries `ldd` lists (libc, libssl, libcrypto, libz, libgcc_s, the loader, ...),
#   at the paths the loader looks for them
#   /etc/ssl/certs/ca-certificates.crt   CA certificates (SSL_CERT_FILE points at them)
#   /etc/passwd, /etc/group     a non-root user `herald`, uid/gid 65532
#   /etc/nsswitch.conf          `hosts: files dns`
#   /tmp                        mode 1777
# Config: user 65532:65532, entrypoint `/herald serve`, HERALD_BIND=0.0.0.0, port 8000 exposed,
# STOPSIGNAL SIGTERM (the node drains: docs/deploy.md), OCI labels (version, source, revision).
# No base image is pulled: nothing but the files above is in it.
#
# Environment:
#   HERALD_BIN          the binary to put in (default: `cargo build --release -p herald-server`,
#                       then target/release/herald)
#   HERALD_IMAGE_OUT    the OCI archive to write (default: target/image/herald.oci.tar)
#   HERALD_IMAGE_NAME   the image's name (default: localhost/herald:<version>)
#   HERALD_IMAGE_KEEP   1: also keep the image in buildah's local storage (default storage, or
#                       BUILDAH_ROOT/BUILDAH_RUNROOT when set); otherwise the storage is a
#                       temporary directory, removed at the end
#   HERALD_IMAGE_STRIP  0: keep the binary's debug info (default 1: `strip --strip-debug`)
#   HERALD_IMAGE_SOURCE the `org.opencontainers.image.source` label (default: the git remote
#                       `origin`, or "herald" when there is none)
# Load the archive elsewhere with `podman load -i target/image/herald.oci.tar`, `docker load -i …`
# (Docker 25 or later) or `skopeo copy oci-archive:target/image/herald.oci.tar docker://REGISTRY/herald:TAG`.
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$PWD

die() { echo "image.sh: $*" >&2; exit 1; }

if ! command -v buildah >/dev/null 2>&1; then
  echo "== installing buildah (Debian package buildah)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi

bin=${HERALD_BIN:-}
if [ -z "$bin" ]; then
  echo "== cargo build --release -p herald-server"
  nice cargo build --release --locked -p herald-server
  bin=target/release/herald
fi
[ -f "$bin" ] || die "HERALD_BIN: no file at $bin"
[ -x "$bin" ] || die "HERALD_BIN: $bin is not executable"
bin=$(readlink -f "$bin")
out=${HERALD_IMAGE_OUT:-target/image/herald.oci.tar}
mkdir -p "$(dirname "$out")"
out=$(readlink -f "$(dirname "$out")")/$(basename "$out")

version=$("$bin" --version 2>/dev/null | awk '{print $2}') || true
[ -n "$version" ] || die "$bin --version printed no version: is it the herald binary?"
name=${HERALD_IMAGE_NAME:-localhost/herald:$version}
source_url=${HERALD_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || echo herald)}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d "${TMPDIR:-/tmp}/herald-image.XXXXXX")
keep=${HERALD_IMAGE_KEEP:-0}
store=()
if [ "$keep" = 1 ]; then
  [ -n "${BUILDAH_ROOT:-}" ] && store+=(--root "$BUILDAH_ROOT")
  [ -n "${BUILDAH_RUNROOT:-}" ] && store+=(--runroot "$BUILDAH_RUNROOT")
else
  store=(--root "$work/storage" --runroot "$work/run")
fi
buildah=(buildah --storage-driver vfs "${store[@]}")
ctr=""
cleanup() {
  if [ -n "$ctr" ]; then
    "${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true
  fi
  if [ "$keep" != 1 ]; then
    # vfs storage made as root may hold read-only directories: make them writable first.
    chmod -R u+w "$work" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The root filesystem, assembled in a plain directory and copied in as one layer.
rootfs=$work/rootfs
mkdir -p "$rootfs"/{etc/ssl/certs,tmp}
chmod 1777 "$rootfs/tmp"
install -m 0755 "$bin" "$rootfs/herald"
# The release profile keeps line tables (debug = 1): most of a 170 MB binary. The image drops
# them (function names stay, so backtraces still name functions); HERALD_IMAGE_STRIP=0 keeps them.
if [ "${HERALD_IMAGE_STRIP:-1}" = 1 ]; then
  command -v strip >/dev/null 2>&1 || die "strip not found (Debian package binutils), or set HERALD_IMAGE_STRIP=0"
  strip --strip-debug "$rootfs/herald"
fi

# Every shared library the binary loads (ldd resolves the whole tree), and the loader.
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
if ldd "$bin" | grep -q "not found"; then
  die "ldd $bin: a library is missing on this machine: $(ldd "$bin" | grep 'not found')"
fi
[ -n "$libs" ] || die "ldd $bin lists no libraries: a static binary? (then drop this step)"
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done

ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || die "no CA bundle at $ca (Debian package ca-certificates)"
cp -L "$ca" "$rootfs/etc/ssl/certs/ca-certificates.crt"
cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
herald:x:65532:65532:herald:/tmp:/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
herald:x:65532:
EOF
echo "hosts: files dns" > "$rootfs/etc/nsswitch.conf"

ctr=$("${buildah[@]}" from scratch)
"${buildah[@]}" copy --quiet "$ctr" "$rootfs" / >/dev/null
"${buildah[@]}" config \
  --user 65532:65532 \
  --workingdir /tmp \
  --entrypoint '["/herald"]' \
  --cmd serve \
  --env HERALD_BIND=0.0.0.0 \
  --env HERALD_PORT=8000 \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --port 8000/tcp \
  --stop-signal SIGTERM \
  --label org.opencontainers.image.title=herald \
  --label org.opencontainers.image.description="Herald real-time messaging server" \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.source="$source_url" \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.created="$created" \
  "$ctr"
"${buildah[@]}" commit --quiet --format oci --rm "$ctr" "$name" >/dev/null
ctr=""
rm -f "$out"
"${buildah[@]}" push --quiet "$name" "oci-archive:$out:$name" >/dev/null
if [ "$keep" != 1 ]; then
  "${buildah[@]}" rmi "$name" >/dev/null 2>&1 || true
fi

# Size: the compressed layers (what a registry stores and a node pulls) and the unpacked files.
unpacked=$(du -sb "$rootfs" | cut -f1)
python3 - "$out" "$name" "${out#"$root_dir"/}" "$unpacked" <<'EOF'
import json, os, sys, tarfile
out, name, shown, unpacked = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with tarfile.open(out) as t:
    read = lambda n: json.load(t.extractfile(n))
    index = read("index.json")
    manifest = read("blobs/" + index["manifests"][0]["digest"].replace(":", "/"))
    layers = sum(l["size"] for l in manifest["layers"])
mb = lambda n: f"{n / 1e6:.1f} MB"
print(f"image {name}: {shown}")
print(f"size: {mb(layers)} compressed layers, {mb(unpacked)} unpacked, archive {mb(os.path.getsize(out))}")
EOF
