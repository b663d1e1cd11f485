#!/usr/bin/env bash
# Builds gVisor's runsc (the `gvisor` runtime class of the local backend) from the Go module
# proxy, pinned, into a cache outside the clone keyed by version:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/<version>/runsc
# and prints that path on stdout. An existing binary is kept (no rebuild).
#
# runsc MUST be static (CGO_ENABLED=0): the default cgo build is dynamic and fails every
# sandbox with "error executing umounter: fork/exec /proc/self/exe: no such file or
# directory" (runsc re-executes itself inside an empty chroot without a dynamic loader).
# The proxy serves no branch queries (`@go` is refused), so the version is the go-branch
# pseudo-version. A cold build takes ~1-3 min on 2 cores.
# Usage: build-runsc.sh          Environment: SANDBOXD_CACHE, SANDBOXD_RUNSC_VERSION, GO.
set -euo pipefail

VERSION="${SANDBOXD_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
GO="${GO:-go}"
DIR="$CACHE/runsc/$VERSION"
OUT="$DIR/runsc"

log() { echo "build-runsc: $*" >&2; }

mkdir -p "$DIR"
# One build at a time (make -j, two CI steps): the second waits and then finds the binary.
exec 9>"$DIR/.lock"
flock 9

if [ -x "$OUT" ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

t0=$(date +%s)
TMP=$(mktemp -d "$DIR/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "building gvisor.dev/gvisor/runsc@$VERSION (static; takes ~1-3 min)"
# Outside any module, so the clone's go.mod and GOFLAGS=-mod=... play no part.
(cd "$TMP" && CGO_ENABLED=0 GOFLAGS= GOBIN="$TMP/bin" \
  "$GO" install -trimpath -ldflags='-s -w' "gvisor.dev/gvisor/runsc@$VERSION")
"$TMP/bin/runsc" --version >/dev/null
mv -f "$TMP/bin/runsc" "$OUT"
log "built $OUT ($(du -h "$OUT" | cut -f1)) in $(( $(date +%s) - t0 ))s"
echo "$OUT"
