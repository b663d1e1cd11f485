# go_build_module LOG MOD VERSION PKG OUT CHECK [LDFLAGS]: builds package PKG (relative, e.g.
# ./cmd) of Go module MOD at VERSION into OUT (a versioned cache path), static, unless an
# executable OUT exists. For modules whose go.mod has replace or exclude directives, which
# `go install pkg@version` (go-install-cached.sh) refuses: the module is fetched from the
# proxy (`go mod download`, checked against sum.golang.org) and built in place, read-only,
# with its own go.mod and go.sum. CHECK is a command run with the built binary as its last
# argument before it is installed by one rename (so an executable OUT is a whole one: no
# lock needed to use it); flock makes a second build of the same OUT wait and then find it.
# LOG prefixes messages; GO names the go command (default go); GO_BUILD_TAGS, when set,
# are the build's -tags.
go_build_module() {
  local log=$1 mod=$2 version=$3 pkg=$4 out=$5 check=$6 ldflags="-s -w ${7:-}"
  local go=${GO:-go} dir t0 tmp src
  dir=$(dirname "$out")
  if [ ! -x "$out" ]; then
    mkdir -p "$dir"
    exec 9>"$dir/.lock"
    flock 9
  fi
  if [ -x "$out" ]; then
    echo "$log: cached: $out" >&2
    return 0
  fi
  t0=$(date +%s)
  tmp=$(mktemp -d "$dir/.build.XXXXXX")
  trap "rm -rf '$tmp'" EXIT
  echo "$log: building $mod/${pkg#./}@$version" >&2
  # Outside any module, so the clone's go.mod and GOFLAGS play no part.
  src=$(cd "$tmp" && GOFLAGS= "$go" mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$src" ] && [ -f "$src/go.mod" ] || { echo "$log: go mod download $mod@$version gave no module directory" >&2; return 1; }
  # The module cache is read-only; the build writes nothing there (-mod=readonly, the
  # module's own go.sum), its output goes to $tmp.
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off \
    "$go" build -trimpath ${GO_BUILD_TAGS:+-tags="$GO_BUILD_TAGS"} -ldflags="$ldflags" -o "$tmp/bin" "$pkg")
  $check "$tmp/bin"
  mv -f "$tmp/bin" "$out"
  echo "$log: built $out ($(du -h "$out" | cut -f1)) in $(( $(date +%s) - t0 ))s" >&2
}
