# Sourced by the build-*.sh scripts that build by hand (not go_install_cached or
# go_build_module) into a cache outside the clone keyed by version, e.g.
#   ${SANDBOXD_CACHE:-/var/cache/sandboxd}/runsc/<version>+<key>/runsc
# The cached result is installed by one rename, so a present one is a whole one: no lock
# is needed to use it (a user who cannot write the cache, e.g. tests run without root, can).
#
#   if cached_build_begin LOG OUT [TEST...]; then
#     ... build into "$CACHED_BUILD_TMP" ...
#     cached_build_install LOG "$CACHED_BUILD_TMP/result" OUT
#   fi
#
# Both exit the script on a failure (cached_build_begin is called as a condition, where
# set -e does not reach), so they are called from the script, not in $(...).
# cached_build_begin: whether OUT must be built. TEST (a command; default `test -x OUT`)
# says whether the cache holds it: then it logs "LOG: cached: OUT" and returns 1. Else it
# takes the lock OUT's directory keeps (DIR/.lock, flock on fd 9: a second build of the same
# key, make -j or two CI steps, waits for the first and then finds its result), tests again,
# and returns 0 with the lock held and CACHED_BUILD_TMP a fresh directory in DIR (the same
# file system as OUT, so the install is a rename), removed when the script exits.
# cached_build_install: moves SRC to OUT (a directory OUT is replaced), logs what it built.

CACHED_BUILD_TMPS=()
CACHED_BUILD_T0=

cached_build_cleanup() {
  local d
  for d in "${CACHED_BUILD_TMPS[@]}"; do
    rm -rf "$d"
  done
}

cached_build_begin() {
  local log=$1 out=$2
  shift 2
  [ $# -gt 0 ] || set -- test -x "$out"
  if "$@"; then
    echo "$log: cached: $out" >&2
    return 1
  fi
  # Called as a condition, where set -e does not reach: a failure exits here.
  local dir
  dir=$(dirname "$out")
  mkdir -p "$dir" || exit 1
  { exec 9>"$dir/.lock"; } || exit 1
  flock 9 || exit 1
  if "$@"; then
    echo "$log: cached: $out" >&2
    return 1
  fi
  CACHED_BUILD_T0=$(date +%s)
  CACHED_BUILD_TMP=$(mktemp -d "$dir/.build.XXXXXX") || exit 1
  if [ ${#CACHED_BUILD_TMPS[@]} -eq 0 ]; then
    trap cached_build_cleanup EXIT
  fi
  CACHED_BUILD_TMPS+=("$CACHED_BUILD_TMP")
  return 0
}

cached_build_install() {
  local log=$1 src=$2 out=$3
  # rename(2) does not replace a directory: the old one goes first (under the lock; a
  # TEST of a marker written last sees the old whole, or nothing, or the new whole).
  if [ -d "$src" ] && [ -e "$out" ]; then
    rm -rf "$out" || exit 1
  fi
  mv -f "$src" "$out" || exit 1
  echo "$log: built $out ($(du -sh "$out" | cut -f1)) in $(($(date +%s) - CACHED_BUILD_T0))s" >&2
}
