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
OUT="$CACHE/seaweedfs/$VERSION/weed"
. "$(dirname "$0")/lib/go-build-module.sh"

# check BIN: the binary runs.
check() { "$1" version >/dev/null; }

go_build_module build-seaweedfs "$MOD" "$VERSION" ./weed "$OUT" check
echo "$OUT"
