#!/usr/bin/env bash
# Installs the Debian packages sandboxd's single-host runtime and its tests need, when
# missing. Needs root. Usage: install-deps.sh [--test]
set -euo pipefail
pkgs=(runc busybox-static nftables iproute2 ca-certificates debootstrap curl btrfs-progs) # btrfs-progs: mkfs.btrfs for the local backend's volume pool (file-system snapshots)
[ "${1:-}" = "--test" ] && pkgs+=(make git postgresql haproxy chromium) # postgresql: internal/store tests start their own server; haproxy: bench/edge compares the edge with HAProxy; chromium: test/console drives the web console in it
[ "${1:-}" = "--k8s" ] && pkgs+=(etcd-server containerd containernetworking-plugins iptables openssl kubectl) # test/k8s/up.sh; kubectl: test/k8s applies the runner manifests
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
