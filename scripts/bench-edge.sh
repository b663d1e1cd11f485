#!/usr/bin/env bash
# Measures the edge against HAProxy doing the same jobs on loopback, in one run, and prints
# each figure with the ratio edge/HAProxy (target >= 0.9): HTTPS requests/s over keep-alive,
# TLS passthrough MB/s, new TLS connections/s. Needs haproxy (install-deps.sh --test).
# Usage: scripts/bench-edge.sh [seconds per target per figure, default 3s]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v haproxy >/dev/null; then
  echo "bench-edge: haproxy is not installed; run scripts/install-deps.sh --test (or apt-get install -y haproxy)" >&2
  exit 1
fi
EDGE_BENCH_DURATION="${1:-3s}" exec go test -run '^$' -bench . -benchtime 1x -timeout 10m ./bench/edge
