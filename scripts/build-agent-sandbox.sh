#!/usr/bin/env bash
# Builds the kubernetes-sigs/agent-sandbox controller (the Kubernetes peer test/k8s's
# BenchmarkTimeToFirstCommand measures beside our runner) from the Go module proxy into
# ${SANDBOXD_CACHE:-/var/cache/sandboxd}/agent-sandbox/<version>/agent-sandbox, once (a
# cached binary is kept; flock serialises concurrent builds), and copies the CRDs the
# module ships (k8s/crds/*.yaml: Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool)
# from the module cache into .../<version>/crds/. Prints the version directory.
# The build runs outside any module (`go install pkg@version`, the module's own go.mod),
# so none of its dependencies reach ours. ~2-4 min cold on 2 busy cores.
# Usage: build-agent-sandbox.sh     Environment: SANDBOXD_CACHE, SANDBOXD_AGENT_SANDBOX_VERSION, GO.
set -euo pipefail
. "$(dirname "$0")/lib/go-install-cached.sh"
VERSION="${SANDBOXD_AGENT_SANDBOX_VERSION:-v1.0.1}"
MOD=sigs.k8s.io/agent-sandbox
dir="${SANDBOXD_CACHE:-/var/cache/sandboxd}/agent-sandbox/$VERSION"
go_install_cached agent-sandbox "$VERSION" "$MOD/cmd/agent-sandbox-controller" \
  "-s -w -X $MOD/internal/version.gitVersion=$VERSION" >/dev/null
if [ ! -s "$dir/crds/.complete" ]; then
  exec 9>"$dir/.lock"
  flock 9
  if [ ! -s "$dir/crds/.complete" ]; then
    src=$(cd / && GOFLAGS= "${GO:-go}" mod download -json "$MOD@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src/k8s/crds" ] || { echo "build-agent-sandbox: no k8s/crds in $src" >&2; exit 1; }
    rm -rf "$dir/crds.tmp" && mkdir -p "$dir/crds.tmp"
    cp "$src"/k8s/crds/*.yaml "$dir/crds.tmp/"
    chmod 644 "$dir/crds.tmp/"*.yaml
    ls "$dir/crds.tmp" >"$dir/crds.tmp/.complete"
    rm -rf "$dir/crds" && mv "$dir/crds.tmp" "$dir/crds"
    echo "build-agent-sandbox: CRDs from $src/k8s/crds" >&2
  fi
fi
echo "$dir"
