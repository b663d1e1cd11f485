#!/usr/bin/env bash
# Builds SeaweedFS (`weed`, Apache-2.0), a real S3-compatible server for internal/blob/s3's
# tests, from the Go module proxy, static (CGO_ENABLED=0), into a cache outside the clone:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/seaweedfs/<version>/weed
# and prints that path on stdout. An existing binary is kept (no rebuild); flock makes a
# second build of the same version wait and then find it. Not MinIO's server (AGPL).
#
# Not `go install …/weed@version` (scripts/lib/go-install-cached.sh): seaweedfs's go.mod has
# replace directives, which `go install pkg@version` refuses. So the module is fetched from
# the proxy (`go mod download`, checked against sum.golang.org) and built in place with its
# own go.mod and go.sum, as build-compose-plugin.sh does.
# Usage: build-seaweedfs.sh     Environment: SANDBOXD_CACHE, SANDBOXD_SEAWEEDFS_VERSION, GO.
set -euo pipefail
VERSION="${SANDBOXD_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
MOD=github.com/seaweedfs/seaweedfs
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
GO="${GO:-go}"
DIR="$CACHE/seaweedfs/$VERSION"
OUT="$DIR/weed"
log() { echo "build-seaweedfs: $*" >&2; }

# Installed by one rename, so an executable file is a whole one: no lock needed to use it.
if [ ! -x "$OUT" ]; then
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock 9
fi
if [ -x "$OUT" ]; then
  log "cached: $OUT"
else
  t0=$(date +%s)
  tmp=$(mktemp -d "$DIR/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  log "building $MOD/weed@$VERSION"
  # Outside any module, so the clone's go.mod and GOFLAGS play no part.
  src=$(cd "$tmp" && GOFLAGS= "$GO" mod download -json "$MOD@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$src" ] && [ -f "$src/go.mod" ] || { log "go mod download $MOD@$VERSION gave no module directory"; exit 1; }
  # The module cache is read-only; the build writes nothing there (-mod=readonly, the
  # module's own go.sum), its output goes to $tmp.
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off \
    "$GO" build -trimpath -ldflags="-s -w" -o "$tmp/weed" ./weed)
  "$tmp/weed" version >/dev/null
  mv -f "$tmp/weed" "$OUT"
  log "built $OUT ($(du -h "$OUT" | cut -f1)) in $(( $(date +%s) - t0 ))s"
fi
echo "$OUT"
