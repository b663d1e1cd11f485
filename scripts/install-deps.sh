#!/usr/bin/env bash
# Installs the Debian packages sandboxd's single-host runtime and its tests need, when
# missing. Needs root. Usage: install-deps.sh [--test]
set -euo pipefail
pkgs=(runc busybox-static nftables iproute2 ca-certificates debootstrap curl btrfs-progs) # btrfs-progs: mkfs.btrfs for the local backend's volume pool (file-system snapshots)
[ "${1:-}" = "--test" ] && pkgs+=(make git postgresql haproxy chromium docker.io crun) # postgresql: internal/store tests start their own server; haproxy: bench/edge compares the edge with HAProxy; chromium: test/console drives the web console in it; docker.io: bench's BenchmarkDockerPeer runs its own dockerd beside sandboxd (the package's service must not run, see below); crun: `make crun-test` and BenchmarkCreateCPU run the runc class with it (docs/oci-runtime.md)
[ "${1:-}" = "--k8s" ] && pkgs+=(etcd-server containerd containernetworking-plugins iptables openssl kubectl) # test/k8s/up.sh; kubectl: test/k8s applies the runner manifests
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
# No service starts during the install (a policy-rc.d that exits 101 denies every
# invoke-rc.d and deb-systemd-invoke start): above all not docker.io's dockerd, whose
# default iptables rules set FORWARD's policy to DROP and cut sandboxes off. A
# policy-rc.d already there is put back afterwards.
policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ] || [ -L "$policy" ]; then
  # Moved aside as it is (a symlink stays a symlink; its target is never written).
  saved=$(mktemp -u "$policy.sandboxd-saved.XXXXXX")
  mv "$policy" "$saved"
fi
restore_policy() {
  rm -f "$policy"
  if [ -n "$saved" ]; then mv -f "$saved" "$policy"; fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' >"$policy"
chmod 755 "$policy"
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# Nor at the next boot (the package enables its units).
if [[ " ${missing[*]} " == *" docker.io "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now docker.service docker.socket >/dev/null 2>&1 || true
fi
