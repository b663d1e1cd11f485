#!/usr/bin/env bash
# Builds helm (pinned) from the Go module proxy into
# ${SANDBOXD_CACHE:-/var/cache/sandboxd}/helm/<version>/helm and prints that path. A cold
# build takes ~3-5 min on 2 busy cores. deploy/helm/sandboxd-runner is rendered with it
# (make manifests) and test/k8s checks the chart against the test cluster's API server.
# Usage: build-helm.sh          Environment: SANDBOXD_CACHE, SANDBOXD_HELM_VERSION, GO.
set -euo pipefail
. "$(dirname "$0")/lib/go-install-cached.sh"
VERSION="${SANDBOXD_HELM_VERSION:-v3.16.4}"
go_install_cached helm "$VERSION" helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
