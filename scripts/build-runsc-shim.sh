#!/usr/bin/env bash
# Builds gVisor's containerd shim (containerd-shim-runsc-v1, the `runsc` handler of a
# Kubernetes node's gVisor RuntimeClass) from the Go module proxy, pinned to the runsc
# version of build-runsc.sh, with four small patches (scripts/runsc-shim/), into a cache
# outside the clone keyed by version and patch set:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc-shim/<version>+<PATCHES>/containerd-shim-runsc-v1
# and prints that path on stdout. An existing binary is kept; flock makes a second build wait.
#
# The patches make the stock shim start on this VM's Debian containerd 1.6 (test/k8s):
# - gvisor-0001-oom-score.patch: the shim lowers its OOM score to -999, which needs
#   CAP_SYS_RESOURCE that this VM's root lacks; the stock shim then fails every start.
#   Patched, EPERM is a warning and the shim keeps containerd's score (what containerd's own
#   runc shim does: it only raises its score).
# - containerd-0001-bare-start-reply.patch (in the containerd/v2 shim library the gVisor
#   shim is built with): the `start` action replies with the bare ttrpc address, which
#   containerd 1.6 dials as it is; 1.7+ accept it too. Unpatched it replies JSON, which 1.6
#   dials as an address and fails.
# - gvisor-0002-kubelet-pods-dir.patch: the shim finds a Pod's volumes (for its mount
#   hints: the Pod-shared tmpfs of the agent's socket dir) under /var/lib/kubelet/pods,
#   fixed; $SANDBOXD_KUBELET_PODS_DIR (in containerd's environment) names another, for
#   test/k8s's kubelet whose --root-dir is under its data dir. Unset: unchanged.
# - gvisor-0003-restore-on-start.patch + zz_sandboxd_restore.go.in (copied into the shim's
#   runsc package; its test zz_sandboxd_restore_test.go.in runs here first, as root): a
#   container whose spec carries the annotation dev.sandboxd.restore.checkpoint-id=<id> is
#   restored (`runsc restore`) from <sandboxd_checkpoint_root>/<id> instead of started. The
#   id is pattern-checked ([a-z0-9][a-z0-9-]{0,62}); the root comes from the shim's config
#   file (key sandboxd_checkpoint_root), and it and the image directory must be real
#   directories owned by root, writable only by it (the root's parents root's and not
#   writable by others unless sticky), and the image complete: its marker file
#   sandboxd-complete (hibernate.MarkComplete, after a successful checkpoint) a regular file
#   of root's; all checked at Create (errdefs InvalidArgument/NotFound/FailedPrecondition).
#   A sandbox whose restore still fails is killed, force-deleted (runsc delete --force) and
#   marked stopped (pkg/shim/v1/proc/init_state.go; stock, a failed root container stays
#   created and its delete hangs). The patch also lets
#   $SANDBOXD_RUNSC_SHIM_CONFIG (in containerd's environment) name that config file ahead of
#   /run/containerd/runsc/config.toml and /etc/containerd/runsc/config.toml: test/k8s keeps
#   it in its data dir. The stock shim never restores on start (its Task API has no
#   restore); checkpoints are taken through its own hibernate server
#   (enable_hibernate_server, internal/nodeagent/hibernate).
# A node whose containerd is 1.7+ and whose root has CAP_SYS_RESOURCE runs the stock shim
# unless it restores checkpoints (gvisor-0003).
# Usage: build-runsc-shim.sh     Environment: SANDBOXD_CACHE, SANDBOXD_RUNSC_VERSION, GO.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/cached-build.sh"
VERSION="${SANDBOXD_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
# Bump when scripts/runsc-shim changes.
PATCHES=patches6
go="${GO:-go}"
out="${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc-shim/$VERSION+$PATCHES/containerd-shim-runsc-v1"
if ! cached_build_begin build-runsc-shim "$out"; then
  echo "$out"
  exit 0
fi
tmp=$CACHED_BUILD_TMP
echo "build-runsc-shim: building gvisor.dev/gvisor/shim@$VERSION with scripts/runsc-shim patches" >&2
moddir() { (cd "$tmp" && GOFLAGS= "$go" mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'); }
src=$(moddir "gvisor.dev/gvisor@$VERSION")
[ -d "$src" ] || { echo "build-runsc-shim: gvisor.dev/gvisor@$VERSION: no module dir" >&2; exit 1; }
cp -r "$src" "$tmp/gvisor"
chmod -R u+w "$tmp/gvisor"
cver=$(sed -n 's/^[[:space:]]*github.com\/containerd\/containerd\/v2 \(v[^ ]*\)$/\1/p' "$tmp/gvisor/go.mod")
[ -n "$cver" ] || { echo "build-runsc-shim: no containerd/v2 version in gvisor's go.mod" >&2; exit 1; }
csrc=$(moddir "github.com/containerd/containerd/v2@$cver")
[ -d "$csrc" ] || { echo "build-runsc-shim: containerd/v2@$cver: no module dir" >&2; exit 1; }
cp -r "$csrc" "$tmp/containerd"
chmod -R u+w "$tmp/containerd"
(cd "$tmp/gvisor" && patch -s -p1 --forward --fuzz=0 <"$here/runsc-shim/gvisor-0001-oom-score.patch")
(cd "$tmp/gvisor" && patch -s -p1 --forward --fuzz=0 <"$here/runsc-shim/gvisor-0002-kubelet-pods-dir.patch")
(cd "$tmp/gvisor" && patch -s -p1 --forward --fuzz=0 <"$here/runsc-shim/gvisor-0003-restore-on-start.patch")
cp "$here/runsc-shim/zz_sandboxd_restore.go.in" "$tmp/gvisor/pkg/shim/v1/runsc/zz_sandboxd_restore.go"
(cd "$tmp/containerd" && patch -s -p1 --forward --fuzz=0 <"$here/runsc-shim/containerd-0001-bare-start-reply.patch")
gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$tmp/gvisor/go.mod")
printf 'module sandboxd.local/runsc-shim\n\ngo %s\n\nrequire gvisor.dev/gvisor %s\n\nreplace gvisor.dev/gvisor => ./gvisor\n\nreplace github.com/containerd/containerd/v2 => ./containerd\n' \
  "${gover:-1.25}" "$VERSION" >"$tmp/go.mod"
if [ "$(id -u)" = 0 ]; then # the restore-on-start check's test (its checks are on root ownership)
  cp "$here/runsc-shim/zz_sandboxd_restore_test.go.in" "$tmp/gvisor/pkg/shim/v1/runsc/zz_sandboxd_restore_test.go"
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$go" test -count=1 -run '^TestSandboxdRestoreConf$' gvisor.dev/gvisor/pkg/shim/v1/runsc >&2)
  rm -f "$tmp/gvisor/pkg/shim/v1/runsc/zz_sandboxd_restore_test.go"
else
  echo "build-runsc-shim: not root: TestSandboxdRestoreConf not run" >&2
fi
(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod "$go" build -trimpath -ldflags='-s -w' -o containerd-shim-runsc-v1 gvisor.dev/gvisor/shim)
"$tmp/containerd-shim-runsc-v1" -v >/dev/null
cached_build_install build-runsc-shim "$tmp/containerd-shim-runsc-v1" "$out"
echo "$out"
