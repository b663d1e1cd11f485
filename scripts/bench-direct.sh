#!/usr/bin/env bash
# Direct mTLS data plane vs the gateway, in one run, through the official client: starts a
# `sandboxd dev` on free loopback ports, runs bench/direct/bench_direct.py, stops it.
# Needs: make build images, pip install -r test/conformance/requirements.txt, root.
# Usage: [SANDBOXD=path/to/sandboxd] scripts/bench-direct.sh [execs per mode, default 100]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api=$(port); dp=$(port); edge=$(port)
"${SANDBOXD:-bin/sandboxd}" dev --data-dir "$dir" --listen "127.0.0.1:$api" --data-plane-listen "127.0.0.1:$dp" --edge-listen "127.0.0.1:$edge" >"$dir/log" 2>&1 &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # Sandboxes outlive `sandboxd dev` by design; the benchmark's were stopped by the script.
  awk -v d="$dir" '$2 ~ "^"d {print $2}' /proc/mounts | sort -r | xargs -r umount -l
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$api/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
CWSANDBOX_BASE_URL="http://127.0.0.1:$api" CWSANDBOX_API_KEY="$(cat "$dir/admin-api-key")" \
  python3 bench/direct/bench_direct.py "${1:-100}"
