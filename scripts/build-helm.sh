#!/usr/bin/env bash
# Builds helm (pinned) from the Go module proxy into a cache outside the clone:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/helm/<version>/helm
# and prints that path on stdout. An existing binary is kept. A cold build takes ~3-5 min
# on 2 busy cores. deploy/helm/sandboxd-runner is rendered with it (make manifests) and
# test/k8s checks the chart against the test cluster's API server.
# Usage: build-helm.sh          Environment: SANDBOXD_CACHE, SANDBOXD_HELM_VERSION, GO.
set -euo pipefail

VERSION="${SANDBOXD_HELM_VERSION:-v3.16.4}"
CACHE="${SANDBOXD_CACHE:-/var/cache/sandboxd}"
GO="${GO:-go}"
DIR="$CACHE/helm/$VERSION"
OUT="$DIR/helm"

log() { echo "build-helm: $*" >&2; }

mkdir -p "$DIR"
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
log "building helm.sh/helm/v3/cmd/helm@$VERSION"
# Outside any module, so the clone's go.mod plays no part.
(cd "$TMP" && CGO_ENABLED=0 GOFLAGS= GOBIN="$TMP/bin" \
  "$GO" install -trimpath -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION" "helm.sh/helm/v3/cmd/helm@$VERSION")
mv "$TMP/bin/helm" "$OUT"
log "built $OUT in $(( $(date +%s) - t0 )) s"
echo "$OUT"
