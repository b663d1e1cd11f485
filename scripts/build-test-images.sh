#!/usr/bin/env bash
# Builds the rootfs tarballs used by tests and the demo:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/busybox.tar  (Debian busybox-static)
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/python.tar   (debootstrap bookworm minbase + python3)
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/redis.tar    (debootstrap bookworm minbase + redis-server, redis-tools)
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/engine.tar   (only when asked: debootstrap bookworm minbase +
#       Debian's Docker Engine (docker.io), iptables, iproute2, the compose plugin of
#       build-compose-plugin.sh and scripts/engine/cws-engine{,-up}; ~550 MB, ~1.5 min cold)
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/clients.tar  (only when asked: debootstrap bookworm minbase +
#       curl and Node.js: real HTTPS clients for the egress secret tests, docs/secrets.md)
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/builder.tar  (only when asked: debootstrap bookworm minbase +
#       Debian's Buildah 1.28 (vfs storage, chroot isolation) for image builds inside gVisor, docs/builds.md)
# internal/testimage turns them into OCI images (cached as <name>.oci/ next to each
# tarball) and serves them from an in-process registry on loopback.
# Usage: build-test-images.sh [busybox] [python] [redis] [engine] [builder] [clients]
#   (default: busybox, python and redis; the engine and builder images only when named: .ci/run builds
#   it in the background, `make test` does not wait for it)
# Idempotent: an existing output is kept. Needs root (debootstrap, ownership).
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "build-test-images: run as root (debootstrap, file ownership)" >&2; exit 1; }

CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
OUT="$CACHE/images"
SUITE="${SANDBOXD_SUITE:-bookworm}"
mkdir -p "$OUT"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1fs", b-a}'; }
log() { echo "build-test-images: $*" >&2; }

need_pkgs=()
[ -x /bin/busybox ] && dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  t=$(now)
  log "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  log "apt install took $(elapsed "$t")"
fi

# mirror: first non-security URI of the host's deb822 sources, else sources.list, else default.
mirror() {
  local m=""
  if [ -n "${SANDBOXD_MIRROR:-}" ]; then echo "$SANDBOXD_MIRROR"; return; fi
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk '/^URIs:/ {for (i=2;i<=NF;i++) if ($i !~ /security/) {print $i; exit}}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

TMP=$(mktemp -d "$OUT/.build.XXXXXX")
cleanup() {
  # debootstrap may leave mounts behind on failure
  for m in $(awk -v p="$TMP" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

build_busybox() {
  local t root=$TMP/busybox
  t=$(now)
  mkdir -p "$root"/{bin,etc,tmp,root,home,proc,sys,dev,var/tmp}
  cp /bin/busybox "$root/bin/busybox"
  chmod 0755 "$root/bin/busybox"
  # --install -s makes absolute symlinks /bin/<applet> -> /bin/busybox; run it chrooted so
  # the links land inside the rootfs.
  chroot "$root" /bin/busybox --install -s /bin
  cat >"$root/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home:/bin/false
P
  cat >"$root/etc/group" <<'G'
root:x:0:
nogroup:x:65534:
G
  chmod 1777 "$root/tmp" "$root/var/tmp"
  chmod 0700 "$root/root"
  tar --numeric-owner -C "$root" -cf "$TMP/busybox.tar" .
  mv -f "$TMP/busybox.tar" "$OUT/busybox.tar"
  log "busybox.tar: $(du -h "$OUT/busybox.tar" | cut -f1) in $(elapsed "$t")"
}

# build_debian NAME PACKAGES: a debootstrap minbase of $SUITE with PACKAGES, as NAME.tar.
build_debian() {
  local name=$1 pkgs=$2 extra=${3:-} t root m
  root=$TMP/$name
  t=$(now)
  m=$(mirror)
  log "$name: debootstrap $SUITE from $m with $pkgs (takes ~1.5 min)"
  debootstrap --variant=minbase --include="$pkgs" "$SUITE" "$root" "$m" >"$TMP/debootstrap-$name.log" 2>&1 || {
    tail -n 30 "$TMP/debootstrap-$name.log" >&2; return 1; }
  log "debootstrap took $(elapsed "$t")"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
         "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
         "$root"/usr/share/info/* "$root"/var/log/*.log "$root"/var/log/apt/* \
         "$root"/debootstrap
  # Some debootstrap versions leave /proc or /sys mounted; they are not part of the image.
  for mp in $(awk -v p="$root" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$mp"; done
  find "$root/dev" -mindepth 1 -delete 2>/dev/null || true
  if [ -n "$extra" ]; then "$extra" "$root"; fi
  local t2; t2=$(now)
  tar --numeric-owner --xattrs -C "$root" -cf "$TMP/$name.tar" .
  mv -f "$TMP/$name.tar" "$OUT/$name.tar"
  inputs "$name" >"$OUT/$name.inputs"
  log "$name.tar: $(du -h "$OUT/$name.tar" | cut -f1) (tar $(elapsed "$t2")) in $(elapsed "$t")"
}

build_python() { build_debian python "$PYTHON_PACKAGES"; }
# The engine image: Docker Engine for container-engine sandboxes (cws-engine starts
# dockerd inside gVisor, cws-engine-up loads the handed-in images and runs the Compose file).
build_engine() {
  ENGINE_EXTRA() {
    local root=$1 plugin
    # After debootstrap, so a cold plugin build (or the wait for one) overlaps it.
    plugin=$(bash "$HERE/build-compose-plugin.sh")
    mkdir -p "$root/usr/libexec/docker/cli-plugins" "$root/cws-engine" "$root/var/lib/docker"
    install -m 0755 "$plugin" "$root/usr/libexec/docker/cli-plugins/docker-compose"
    install -m 0755 "$HERE/engine/cws-engine" "$HERE/engine/cws-engine-up" "$root/usr/local/bin/"
    # gVisor implements the legacy iptables interface, not nftables: dockerd's embedded DNS
    # (its per-container DNAT rule) needs iptables-legacy.
    chroot "$root" update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null
    chroot "$root" update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy >/dev/null
    # dockerd is started by cws-engine, never by an init system.
    rm -f "$root"/etc/rc*.d/*docker* "$root"/etc/systemd/system/*.wants/docker* 2>/dev/null || true
  }
  build_debian engine "$ENGINE_PACKAGES" ENGINE_EXTRA
}
build_redis() { build_debian redis "$REDIS_PACKAGES"; }
build_clients() { build_debian clients "$CLIENTS_PACKAGES"; }
# The builder image: Buildah builds a Dockerfile inside a gVisor sandbox (docs/builds.md).
# No runtime (crun/runc) and no fuse-overlayfs: RUN steps use --isolation=chroot and
# layers the vfs driver, both of which work in gVisor's own kernel.
build_builder() {
  BUILDER_EXTRA() {
    local root=$1
    # storage.conf: vfs under /var/lib/containers (the sandbox's root file system, or a
    # cache volume mounted there); containers.conf: chroot isolation, host network for RUN
    # (the build sandbox's own network, under its egress rules), cgroups left alone.
    mkdir -p "$root/etc/containers"
    cat >"$root/etc/containers/storage.conf" <<'S'
[storage]
driver = "vfs"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
S
    cat >"$root/etc/containers/containers.conf" <<'C'
[containers]
netns = "host"
cgroups = "disabled"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
C
    cat >"$root/etc/containers/registries.conf" <<'R'
unqualified-search-registries = []
short-name-mode = "enforcing"
R
  }
  build_debian builder "$BUILDER_PACKAGES" BUILDER_EXTRA
}

# The python image's packages: `python` as well as `python3`, like the python:3.11 image
# the official client defaults to. Changing them (or the suite) rebuilds the image.
PYTHON_PACKAGES=python3,python-is-python3
# The redis image (Compose tests: a service with a redis-cli healthcheck): Debian's
# redis-server and redis-tools, nothing pulled from Docker Hub.
REDIS_PACKAGES=redis-server,redis-tools
# The clients image (egress secret tests: curl and Node.js as real HTTPS clients, a
# sidecar beside the python image's primary): Debian's curl and nodejs, nothing else.
CLIENTS_PACKAGES=curl,nodejs,ca-certificates
# The engine image's packages (Debian's Docker Engine, its containerd and runc come with
# docker.io); its inputs also name the compose plugin's version and the entry scripts.
ENGINE_PACKAGES=docker.io,iptables,iproute2,ca-certificates
# The builder image's packages (its inputs also hash build_builder's config files).
# netavark only because golang-github-containers-common depends on the virtual
# container-network-stack, which debootstrap does not resolve (RUN uses the host netns).
BUILDER_PACKAGES=buildah,netavark,ca-certificates
HERE=$(cd "$(dirname "$0")" && pwd)
inputs() {
  case "$1" in
    python) echo "$SUITE $PYTHON_PACKAGES" ;;
    redis) echo "$SUITE $REDIS_PACKAGES" ;;
    clients) echo "$SUITE $CLIENTS_PACKAGES" ;;
    engine) echo "$SUITE $ENGINE_PACKAGES compose=${SANDBOXD_COMPOSE_VERSION:-v2.40.3} $(cat "$HERE/engine/cws-engine" "$HERE/engine/cws-engine-up" | sha256sum | cut -c1-16)" ;;
    builder) echo "$SUITE $BUILDER_PACKAGES $(declare -f build_builder | sha256sum | cut -c1-16)" ;;
    *) echo "busybox" ;;
  esac
}
cached() {
  [ -s "$OUT/$1.tar" ] || return 1
  [ "$1" = busybox ] && return 0
  [ "$(cat "$OUT/$1.inputs" 2>/dev/null)" = "$(inputs "$1")" ]
}

total=$(now)
# Arguments name the images to build (busybox, python, redis, engine, builder, clients); none means the first three.
[ "$#" -gt 0 ] || set -- busybox python redis
for name in "$@"; do
  case "$name" in
    busybox|python|redis|engine|builder|clients) ;;
    *) log "unknown image $name (want busybox, python, redis, engine, builder or clients)"; exit 2 ;;
  esac
  if cached "$name"; then log "$name.tar cached"; continue; fi
  "build_$name"
done
log "done in $(elapsed "$total"): $OUT"
