#!/usr/bin/env bash
# Builds Jaeger (pinned, Apache-2.0) from the Go module proxy, static (CGO_ENABLED=0), into a
# cache outside the clone:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/jaeger/<version>/jaeger
# and prints the binary's path on stdout. Jaeger v1.75's cmd/jaeger is Jaeger v2 (built on the
# OpenTelemetry collector): test/e2e's TestTracingJaeger runs it with an in-memory store and
# free ports, points `sandboxd dev --otlp-endpoint` at its OTLP receiver and reads the traces
# back from its query API. An existing binary is kept (no rebuild); flock makes a second build
# wait and then find it. Built in place with the module's own go.mod and go.sum
# (scripts/lib/go-build-module.sh), as Jaeger's go.mod pins its own dependency graph.
# Cold: ~4.5 min on 2 cores idle, 31 min under a load of ~20 (2026-12-05; 81 MB); instant
# when cached.
# Environment: SANDBOXD_CACHE, SANDBOXD_JAEGER_VERSION, GO.
set -euo pipefail
VERSION="${SANDBOXD_JAEGER_VERSION:-v1.75.0}"
MOD=github.com/jaegertracing/jaeger
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
DIR="$CACHE/jaeger/$VERSION"
. "$(dirname "$0")/lib/go-build-module.sh"

check() { "$1" version >/dev/null; }
go_build_module build-jaeger "$MOD" "$VERSION" ./cmd/jaeger "$DIR/jaeger" check
echo "$DIR/jaeger"
