#!/usr/bin/env bash
# Starts the multi-cluster test bed on this machine (as root): a control plane, two
# gateway replicas on one PostgreSQL and three runners, each in its own network
# namespace with its own policy. Prints the URLs and keys; ^C (or SIGTERM) tears it all
# down. Needs: make deps images (PostgreSQL, runc, test images).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bed" ./test/bed
"$bin/bed" "$@" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -rf "$bin"' INT TERM
wait $pid
