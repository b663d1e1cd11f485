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
OUT="$CACHE/compose/$VERSION/docker-compose"
. "$(dirname "$0")/lib/go-build-module.sh"

# check BIN: a CLI plugin answers docker's metadata query; a broken binary fails here.
check() { "$1" docker-cli-plugin-metadata | grep -q '"SchemaVersion"'; }

go_build_module build-compose-plugin "$MOD" "$VERSION" ./cmd "$OUT" check "-X $MOD/internal.Version=$VERSION"
check "$OUT"
echo "$OUT"
