#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy from the
# Go module proxy into $SANDBOXD_CACHE/k8s/<version>/bin, once: later runs find the binaries and
# return at once; when only some are missing (a cache from before kube-proxy was added), only
# those are built. A flock serialises concurrent runs. Prints the bin directory.
#
# Recipe (see /work/shared/reference/this-machine.md §6): require k8s.io/kubernetes and pin each
# of its staging modules (its `=> ./staging/...` replaces) to the matching v0.x.y tag, except
# where the proxy lacks that tag (k8s.io/endpointslice v0.32.13 → v0.32.12). CGO_ENABLED=0.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-v1.32.13}
CACHE=${SANDBOXD_CACHE:-/var/cache/sandboxd}
dir=$CACHE/k8s/$K8S_VERSION
bin=$dir/bin
cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

have() { for c in "${cmds[@]}"; do [ -x "$bin/$c" ] || return 1; done; }
if have; then echo "$bin"; exit 0; fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if have; then echo "$bin"; exit 0; fi

staging=v0.${K8S_VERSION#v1.}
src=$dir/src
rm -rf "$src" && mkdir -p "$src"
cd "$src"
t0=$(date +%s)
export GOFLAGS=-mod=mod GOTOOLCHAIN=local
go mod download k8s.io/kubernetes@"$K8S_VERSION"
kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod
{
  echo "module sandboxd.local/k8sbuild"
  echo
  echo "go $(go env GOVERSION | sed 's/^go//')"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kmod" | while read -r m; do
    v=$staging
    # Missing from the proxy at this version: take the previous patch release.
    [ "$m" = k8s.io/endpointslice ] && [ "$staging" = v0.32.13 ] && v=v0.32.12
    echo "	$m => $m $v"
  done
  echo ")"
} >go.mod
{
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  for c in "${cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
  echo ")"
} >tools.go
echo "k8s build: go mod tidy ($K8S_VERSION)" >&2
go mod tidy >&2
t1=$(date +%s)
pkg=k8s.io/component-base/version
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
rm -rf "$dir/bin.tmp" && mkdir -p "$dir/bin.tmp" "$bin"
missing=(); for c in "${cmds[@]}"; do [ -x "$bin/$c" ] || missing+=("$c"); done
echo "k8s build: go build ${missing[*]}" >&2
pkgs=(); for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/bin.tmp/" "${pkgs[@]}" >&2
# One rename per binary: a concurrent reader never sees a binary half written or missing.
for c in "${missing[@]}"; do mv "$dir/bin.tmp/$c" "$bin/$c"; done
rm -rf "$dir/bin.tmp"
t2=$(date +%s)
echo "k8s build: tidy $((t1 - t0)) s, build $((t2 - t1)) s" >&2
echo "$bin"
