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
. "$(dirname "$0")/lib/cached-build.sh"
VERSION="${SANDBOXD_AGENT_SANDBOX_VERSION:-v1.0.1}"
MOD=sigs.k8s.io/agent-sandbox
dir="${SANDBOXD_CACHE:-/var/cache/sandboxd}/agent-sandbox/$VERSION"
# In a subshell: its lock (fd 9) and its EXIT trap end with it.
(go_install_cached agent-sandbox "$VERSION" "$MOD/cmd/agent-sandbox-controller" \
  "-s -w -X $MOD/internal/version.gitVersion=$VERSION") >/dev/null
if cached_build_begin build-agent-sandbox "$dir/crds" test -s "$dir/crds/.complete"; then
  src=$(cd / && GOFLAGS= "${GO:-go}" mod download -json "$MOD@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$src/k8s/crds" ] || { echo "build-agent-sandbox: no k8s/crds in $src" >&2; exit 1; }
  mkdir "$CACHED_BUILD_TMP/crds"
  cp "$src"/k8s/crds/*.yaml "$CACHED_BUILD_TMP/crds/"
  chmod 644 "$CACHED_BUILD_TMP/crds/"*.yaml
  ls "$CACHED_BUILD_TMP/crds" >"$CACHED_BUILD_TMP/crds/.complete"
  cached_build_install build-agent-sandbox "$CACHED_BUILD_TMP/crds" "$dir/crds"
  echo "build-agent-sandbox: CRDs from $src/k8s/crds" >&2
fi
echo "$dir"
