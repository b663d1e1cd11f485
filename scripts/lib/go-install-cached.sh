# Sourced by the build-*.sh scripts: go_install_cached NAME VERSION PACKAGE [LDFLAGS]
# installs PACKAGE@VERSION from the Go module proxy, static (CGO_ENABLED=0) and pinned,
# into a cache outside the clone keyed by version:
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/NAME/VERSION/NAME
# and prints that path on stdout. An existing binary is kept (no rebuild); flock makes a
# second build of the same version (make -j, two CI steps) wait and then find it.
# Environment: SANDBOXD_CACHE, GO.

go_install_cached() {
  local name=$1 version=$2 pkg=$3 ldflags=${4:--s -w}
  local cache="${SANDBOXD_CACHE:-/var/cache/sandboxd}" go="${GO:-go}"
  local dir="$cache/$name/$version"
  local out="$dir/$name"
  # Installed by one rename, so an executable file is a whole one: no lock needed to use
  # it (a user who cannot write the cache, e.g. tests run without root, can).
  if [ -x "$out" ]; then
    echo "build-$name: cached: $out" >&2
    echo "$out"
    return 0
  fi
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [ -x "$out" ]; then
    echo "build-$name: cached: $out" >&2
    echo "$out"
    return 0
  fi
  local t0 tmp
  t0=$(date +%s)
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  echo "build-$name: building $pkg@$version" >&2
  # Outside any module, so the clone's go.mod and GOFLAGS=-mod=... play no part.
  # `|| return`: the caller runs this in $(...), where set -e does not reach.
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS= GOBIN="$tmp/bin" \
    "$go" install -trimpath -ldflags="$ldflags" "$pkg@$version") || return 1
  mv -f "$tmp/bin/$(basename "$pkg")" "$out" || return 1
  echo "build-$name: built $out ($(du -h "$out" | cut -f1)) in $(( $(date +%s) - t0 ))s" >&2
  echo "$out"
}
