#!/usr/bin/env bash
# Starts `sandboxd dev` on loopback and runs examples/first_sandbox.py through the
# official cwsandbox client against it. Run by `make demo` after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${SANDBOXD_DATA_DIR:-/var/lib/sandboxd}"
LISTEN="${SANDBOXD_LISTEN:-127.0.0.1:8080}"

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r test/conformance/requirements.txt

log=$(mktemp)
bin/sandboxd dev --data-dir "$DATA" --listen "$LISTEN" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  if curl -fsS "http://$LISTEN/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "sandboxd dev exited" >&2; exit 1; fi
  sleep 0.2
done
curl -fsS "http://$LISTEN/readyz" >/dev/null || { cat "$log"; exit 1; }
echo "sandboxd dev is up: CWSANDBOX_BASE_URL=http://$LISTEN (API key in $DATA/admin-api-key)"
CWSANDBOX_BASE_URL="http://$LISTEN" CWSANDBOX_API_KEY="$(cat "$DATA/admin-api-key")" python3 examples/first_sandbox.py
