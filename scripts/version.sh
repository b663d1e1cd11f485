#!/usr/bin/env bash
# Prints the version the binaries are built as (internal/version): `git describe --tags
# --always --dirty` of this checkout, or nothing without git or outside a checkout (the
# binaries then fall back to Go's VCS stamp, else "dev").
cd "$(dirname "$0")/.." && git describe --tags --always --dirty 2>/dev/null || true
