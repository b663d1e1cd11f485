#!/usr/bin/env bash
# Builds Prometheus (pinned, Apache-2.0) from the Go module proxy, static (CGO_ENABLED=0),
# into a cache outside the clone:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/prometheus/<version>/{promtool,prometheus}
# and prints the directory on stdout. promtool checks the metrics sandboxd exposes
# (`promtool check metrics`, internal/metrics' tests); the server scrapes a running
# `sandboxd dev` in test/e2e (TestMetricsScrapedByPrometheus). An existing binary is kept
# (no rebuild); flock makes a second build wait and then find it. Built in place with the
# module's own go.mod and go.sum (scripts/lib/go-build-module.sh): Prometheus' go.mod has
# exclude directives, which `go install pkg@version` refuses.
# Cold, with every service-discovery plugin: promtool took 35 min on 2 cores under a load of
# 15-28 (2026-12-04), the server 3.3 min more; without them (GO_BUILD_TAGS below) the
# binaries are 52 MB instead of 84 MB and the build much shorter; instant when cached.
# Usage: build-prometheus.sh [promtool|prometheus|all]   (default all)
# Environment: SANDBOXD_CACHE, SANDBOXD_PROMETHEUS_VERSION, GO.
set -euo pipefail
# Go module v0.316.0 is Prometheus 3.16.0.
VERSION="${SANDBOXD_PROMETHEUS_VERSION:-v0.316.0}"
MOD=github.com/prometheus/prometheus
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
DIR="$CACHE/prometheus/$VERSION"
. "$(dirname "$0")/lib/go-build-module.sh"

check() { "$1" --version >/dev/null; }
# Without the service-discovery plugins (Prometheus' own build tag): sandboxd's tests use
# static targets only, and the plugins (cloud SDKs, client-go) are most of the build.
export GO_BUILD_TAGS=remove_all_sd
ldflags="-X github.com/prometheus/common/version.Version=${VERSION#v}"

what="${1:-all}"
case "$what" in
promtool | all) go_build_module build-promtool "$MOD" "$VERSION" ./cmd/promtool "$DIR/promtool" check "$ldflags" ;;
prometheus) ;;
*) echo "usage: build-prometheus.sh [promtool|prometheus|all]" >&2; exit 2 ;;
esac
case "$what" in
prometheus | all) go_build_module build-prometheus "$MOD" "$VERSION" ./cmd/prometheus "$DIR/prometheus" check "$ldflags" ;;
esac
echo "$DIR"
