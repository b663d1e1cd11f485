#!/usr/bin/env bash
# Builds gVisor's runsc (the `gvisor` runtime class of the local backend) from the Go module
# proxy, pinned, with precompiled seccomp programs, into a cache outside the clone keyed by
# version and by the precompile step's revision:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/<version>+<SECCOMP>/runsc
# and prints that path on stdout. An existing binary is kept (no rebuild); flock makes a
# second build of the same version wait and then find it.
#
# runsc MUST be static (CGO_ENABLED=0): the default cgo build is dynamic and fails every
# sandbox with "error executing umounter: fork/exec /proc/self/exe: no such file or
# directory" (runsc re-executes itself inside an empty chroot without a dynamic loader).
# The proxy serves no branch queries (`@go` is refused), so the version is the go-branch
# pseudo-version.
#
# Precompiled seccomp: gVisor's Bazel build embeds the sentry's and the gofer's seccomp-bpf
# programs, compiled at build time; its Go branch ships none, so a plain `go install`ed runsc
# compiles its sentry's filter at every start (~10 ms of each create, resume and fork, plus
# ~3 ms of the gofer's). This script does what Bazel does with gVisor's own code: it copies
# the module, runs scripts/runsc-seccomp/main.go (gVisor's precompiledseccomp.Precompile over
# gVisor's own rules, for the options a runner uses) in a scratch module that replaces
# gvisor.dev/gvisor with the copy, puts the generated files in place of the two
# filter_precompiled.go stubs, and builds runsc from the copy. The programs are the same
# rules, rendered with the runtime's values at each start; a runsc started with options not
# precompiled builds its filter as before. A cold build takes ~2-4 min on 2 cores.
# Usage: build-runsc.sh          Environment: SANDBOXD_CACHE, SANDBOXD_RUNSC_VERSION, GO.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/cached-build.sh"
VERSION="${SANDBOXD_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
# Bump when scripts/runsc-seccomp changes (keep equal to local.RunscBuild's suffix).
SECCOMP=seccomp1
go="${GO:-go}"
out="${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/$VERSION+$SECCOMP/runsc"
if ! cached_build_begin build-runsc "$out"; then
  echo "$out"
  exit 0
fi
tmp=$CACHED_BUILD_TMP
echo "build-runsc: building gvisor.dev/gvisor/runsc@$VERSION with precompiled seccomp programs" >&2
# Outside any module, so the clone's go.mod and GOFLAGS=-mod=... play no part.
src=$(cd "$tmp" && GOFLAGS= "$go" mod download -json "gvisor.dev/gvisor@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -d "$src" ] || { echo "build-runsc: gvisor.dev/gvisor@$VERSION: no module dir" >&2; exit 1; }
cp -r "$src" "$tmp/gvisor"
chmod -R u+w "$tmp/gvisor"
cp "$here/runsc-seccomp/subset.go.in" "$tmp/gvisor/runsc/boot/filter/config/zz_sandboxd_subset.go"
cp "$here/runsc-seccomp/main.go" "$tmp/main.go"
gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$tmp/gvisor/go.mod")
printf 'module sandboxd.local/runsc-seccomp\n\ngo %s\n\nrequire gvisor.dev/gvisor %s\n\nreplace gvisor.dev/gvisor => ./gvisor\n' \
  "${gover:-1.25}" "$VERSION" >"$tmp/go.mod"
(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$go" build -o gen main.go && ./gen boot.gen gofer.gen)
mv "$tmp/boot.gen" "$tmp/gvisor/runsc/boot/filter/filter_precompiled.go"
mv "$tmp/gofer.gen" "$tmp/gvisor/runsc/fsgofer/filter/filter_precompiled.go"
rm "$tmp/gvisor/runsc/boot/filter/config/zz_sandboxd_subset.go"
(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$go" build -trimpath -ldflags='-s -w' -o runsc gvisor.dev/gvisor/runsc)
"$tmp/runsc" --version >/dev/null
cached_build_install build-runsc "$tmp/runsc" "$out"
echo "$out"
