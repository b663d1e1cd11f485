#!/usr/bin/env bash
# Builds Let's Encrypt's Pebble (a small, real ACME server for tests) from the Go module
# proxy into ${SANDBOXD_CACHE:-/var/cache/sandboxd}/pebble/<version>/pebble and prints
# that path. internal/acme's tests run it. ~10 s cold.
# Usage: build-pebble.sh          Environment: SANDBOXD_CACHE, SANDBOXD_PEBBLE_VERSION, GO.
set -euo pipefail
. "$(dirname "$0")/lib/go-install-cached.sh"
go_install_cached pebble "${SANDBOXD_PEBBLE_VERSION:-v2.10.3}" github.com/letsencrypt/pebble/v2/cmd/pebble
