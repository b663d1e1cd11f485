#!/usr/bin/env bash
# Vendors the few googleapis .proto files our API imports (google/api/annotations.proto and
# google/api/http.proto) into api/third_party, taken from a pinned Go module so the copy is
# reproducible and checksummed by the Go module proxy/sumdb (no network access beyond that).
#
# Only the .proto sources are copied; Go code for them comes from
# google.golang.org/genproto/googleapis/api (their go_package), so buf does not generate them.
#
# Usage: scripts/vendor-googleapis.sh        (run from anywhere; idempotent)
set -euo pipefail

MODULE=github.com/grpc-ecosystem/grpc-gateway
VERSION=v1.16.0
FILES=(
  google/api/annotations.proto
  google/api/http.proto
)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/api/third_party"
cd "$root"

dir=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
src="$dir/third_party/googleapis"
[[ -d $src ]] || { echo "vendor-googleapis: $src not found (go mod download failed?)" >&2; exit 1; }

rm -rf "$dest/google"
for f in "${FILES[@]}"; do
  install -D -m 0644 "$src/$f" "$dest/$f"
done
install -m 0644 "$src/LICENSE" "$dest/LICENSE"
cat >"$dest/README.md" <<MD
# Vendored googleapis protos

Copied verbatim by \`scripts/vendor-googleapis.sh\` from the Go module
\`$MODULE@$VERSION\` (\`third_party/googleapis/\`). Apache-2.0, see LICENSE.
Do not edit; re-run the script instead. Go code for these files is the
\`google.golang.org/genproto/googleapis/api/annotations\` package, so buf only
uses them as imports (not generated, not linted).

Files: ${FILES[*]}
MD
echo "vendored ${#FILES[@]} files from $MODULE@$VERSION into ${dest#"$root"/}"
