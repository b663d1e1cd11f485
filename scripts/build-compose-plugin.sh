#!/usr/bin/env bash
# Builds the Docker Compose CLI plugin (github.com/docker/compose/v2, pinned) from the Go
# module proxy, static (CGO_ENABLED=0), into a cache outside the clone keyed by version:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/compose/<version>/docker-compose
# and prints that path on stdout. An existing binary is kept (no rebuild); flock makes a
# second build of the same version wait and then find it. The engine test image
# (build-test-images.sh engine) installs it as /usr/libexec/docker/cli-plugins/docker-compose,
# so `docker compose` runs inside an engine sandbox with nothing from Docker Hub or GitHub.
#
# Not `go install …/cmd@version` (scripts/lib/go-install-cached.sh): compose's go.mod has
# exclude directives, which `go install pkg@version` refuses. So the module is fetched
# from the proxy (`go mod download`, checked against sum.golang.org) and built in place,
# with its own go.mod and go.sum. A cold build takes ~3-6 min on 2 busy cores.
# Usage: build-compose-plugin.sh     Environment: SANDBOXD_CACHE, SANDBOXD_COMPOSE_VERSION, GO.
set -euo pipefail
VERSION="${SANDBOXD_COMPOSE_VERSION:-v2.40.3}"
MOD=github.com/docker/compose/v2
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
GO="${GO:-go}"
DIR="$CACHE/compose/$VERSION"
OUT="$DIR/docker-compose"
log() { echo "build-compose-plugin: $*" >&2; }

# check BIN: a CLI plugin answers docker's metadata query; a broken binary fails here.
check() { "$1" docker-cli-plugin-metadata | grep -q '"SchemaVersion"'; }

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
  log "building $MOD/cmd@$VERSION"
  # Outside any module, so the clone's go.mod and GOFLAGS play no part.
  src=$(cd "$tmp" && GOFLAGS= "$GO" mod download -json "$MOD@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$src" ] && [ -f "$src/go.mod" ] || { log "go mod download $MOD@$VERSION gave no module directory"; exit 1; }
  # The module cache is read-only; the build writes nothing there (-mod=readonly, the
  # module's own go.sum), its output goes to $tmp.
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off \
    "$GO" build -trimpath -ldflags="-s -w -X $MOD/internal.Version=$VERSION" -o "$tmp/docker-compose" ./cmd)
  check "$tmp/docker-compose"
  mv -f "$tmp/docker-compose" "$OUT"
  log "built $OUT ($(du -h "$OUT" | cut -f1)) in $(( $(date +%s) - t0 ))s"
fi
check "$OUT"
echo "$OUT"
