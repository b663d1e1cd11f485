#!/usr/bin/env bash
# Builds gVisor's runsc (the `gvisor` runtime class of the local backend) from the Go module
# proxy, pinned, into a cache outside the clone keyed by version:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/<version>/runsc
# and prints that path on stdout (scripts/lib/go-install-cached.sh). An existing binary is
# kept (no rebuild).
#
# runsc MUST be static (CGO_ENABLED=0): the default cgo build is dynamic and fails every
# sandbox with "error executing umounter: fork/exec /proc/self/exe: no such file or
# directory" (runsc re-executes itself inside an empty chroot without a dynamic loader).
# The proxy serves no branch queries (`@go` is refused), so the version is the go-branch
# pseudo-version. A cold build takes ~1-3 min on 2 cores.
# Usage: build-runsc.sh          Environment: SANDBOXD_CACHE, SANDBOXD_RUNSC_VERSION, GO.
set -euo pipefail
. "$(dirname "$0")/lib/go-install-cached.sh"
VERSION="${SANDBOXD_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
OUT=$(go_install_cached runsc "$VERSION" gvisor.dev/gvisor/runsc)
"$OUT" --version >/dev/null
echo "$OUT"
