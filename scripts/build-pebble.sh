#!/usr/bin/env bash
# Builds Let's Encrypt's Pebble (a small, real ACME server for tests) from the Go module
# proxy, pinned, into a cache outside the clone keyed by version:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/pebble/<version>/pebble
# and prints that path on stdout. An existing binary is kept. internal/acme's tests run it.
# Usage: build-pebble.sh          Environment: SANDBOXD_CACHE, SANDBOXD_PEBBLE_VERSION, GO.
set -euo pipefail

VERSION="${SANDBOXD_PEBBLE_VERSION:-v2.10.3}"
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
GO="${GO:-go}"
DIR="$CACHE/pebble/$VERSION"
OUT="$DIR/pebble"

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if [ -x "$OUT" ]; then
  echo "build-pebble: cached: $OUT" >&2
  echo "$OUT"
  exit 0
fi
t0=$(date +%s)
TMP=$(mktemp -d "$DIR/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# Outside any module, so the clone's go.mod plays no part.
(cd "$TMP" && CGO_ENABLED=0 GOFLAGS= GOBIN="$TMP/bin" \
  "$GO" install -trimpath -ldflags='-s -w' "github.com/letsencrypt/pebble/v2/cmd/pebble@$VERSION")
mv -f "$TMP/bin/pebble" "$OUT"
echo "build-pebble: built $OUT in $(( $(date +%s) - t0 ))s" >&2
echo "$OUT"
