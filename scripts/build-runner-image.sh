#!/usr/bin/env bash
# Builds the Kubernetes runner's two images from this checkout, without a container engine:
# static sandboxd, sandbox-agent and sandbox-gate (CGO_ENABLED=0, -trimpath), then
# deploy/image makes the runner image (entrypoint /sandboxd) and the agent image.
#
#   scripts/build-runner-image.sh [-out DIR] [-push] [-tag T]...   (flags of deploy/image)
#
# RUNNER_IMAGE (default localhost/sandboxd/runner:VERSION) and AGENT_IMAGE (default
# localhost/sandboxd/agent:dev) name them; VERSION is the version the runner reports
# (`sandboxd version`, heartbeats): default the runner image's tag when RUNNER_IMAGE is
# given (`:applyAvailableUpdate` sets the tag to a version), else scripts/version.sh
# (`git describe`), else dev. Binaries go to BIN_DIR (default
# bin/image); GOARCH (default this host's) their architecture. Example, for a registry of
# your own:
#   RUNNER_IMAGE=ghcr.io/me/sandboxd-runner:v1 AGENT_IMAGE=ghcr.io/me/sandbox-agent:v1 \
#     scripts/build-runner-image.sh -push
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${RUNNER_IMAGE:-}" ]; then
  VERSION=${VERSION:-${RUNNER_IMAGE##*:}}
else
  VERSION=${VERSION:-$(bash scripts/version.sh)}
  VERSION=${VERSION:-dev}
  RUNNER_IMAGE=localhost/sandboxd/runner:$VERSION
fi
AGENT_IMAGE=${AGENT_IMAGE-localhost/sandboxd/agent:dev} # set and empty: no agent image
BIN_DIR=${BIN_DIR:-bin/image}
mkdir -p "$BIN_DIR"
export CGO_ENABLED=0
go build -trimpath -ldflags="-s -w -X github.com/sandboxd/sandboxd/internal/version.version=$VERSION" -o "$BIN_DIR/sandboxd" ./cmd/sandboxd
if [ -n "$AGENT_IMAGE" ]; then
  make -s agent BIN="$BIN_DIR" # the one agent build (Makefile)
  go build -trimpath -ldflags='-s -w' -o "$BIN_DIR/sandbox-gate" ./internal/runtime/kubernetes/cmd/sandbox-gate
fi
# The tool runs here: built for this host whatever GOARCH the binaries are for.
env -u GOARCH go run ./deploy/image -arch "$(go env GOARCH)" -sandboxd "$BIN_DIR/sandboxd" -agent "$BIN_DIR/sandbox-agent" -gate "$BIN_DIR/sandbox-gate" \
  -runner-ref "$RUNNER_IMAGE" -agent-ref "$AGENT_IMAGE" "$@"
