#!/usr/bin/env bash
# Tears down what up.sh started and removes every trace: processes (by PID file, then
# containerd shims and pod processes by the paths they run from), mounts under the data
# dir, CRI network namespaces, the CNI bridge, the kubelet's iptables chains, the pod
# cgroups and the data dir itself. Safe to run twice, or after a failed up.sh.
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "down.sh: run as root" >&2; exit 1; }
DATA=${SANDBOXD_K8S_DIR:-/var/lib/sandboxd-k8s}
CGROUP_ROOT=sandboxd-k8s
t0=$(date +%s.%N)
log() { echo "k8s down [$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%d", (b-a)*1000}') ms]: $*" >&2; }
[ -d "$DATA" ] || { log "nothing at $DATA"; exit 0; }
BRIDGE=$(cat "$DATA/run/bridge" 2>/dev/null || echo sbxk8s0)

stop() { # names...: SIGTERM to all at once, SIGKILL to survivors after 5 s
  local n f pids=()
  for n in "$@"; do
    f=$DATA/run/$n.pid
    [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && pids+=("$(cat "$f")")
  done
  if [ "${#pids[@]}" -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null
    for _ in $(seq 50); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[@]}" 2>/dev/null
  fi
  for n in "$@"; do rm -f "$DATA/run/$n.pid"; done
}

# Pods first, through the CRI, while containerd still runs: the kubelet is stopped so it
# does not restart them, then every task in containerd's k8s.io namespace is killed.
stop kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd
CTR=(ctr --address "$DATA/run/containerd.sock" -n k8s.io)
if [ -S "$DATA/run/containerd.sock" ] && "${CTR[@]}" version >/dev/null 2>&1; then
  # Each bounded: a shim that hangs on a delete (it is killed below) never holds the cluster.
  for c in $(timeout 20 "${CTR[@]}" tasks ls -q 2>/dev/null); do timeout 10 "${CTR[@]}" tasks kill -s KILL "$c" >/dev/null 2>&1; done
  sleep 0.5
  for c in $(timeout 20 "${CTR[@]}" tasks ls -q 2>/dev/null); do timeout 10 "${CTR[@]}" tasks delete -f "$c" >/dev/null 2>&1; done
  for c in $(timeout 20 "${CTR[@]}" containers ls -q 2>/dev/null); do timeout 10 "${CTR[@]}" containers delete "$c" >/dev/null 2>&1; done
fi
log "control plane stopped, pods killed"
stop containerd
log "containerd stopped"
# Shims (and anything left in their containers) whose address is ours.
for p in $(pgrep -f "containerd-shim.*-address $DATA/run/containerd.sock" 2>/dev/null); do
  kill -9 "$p" 2>/dev/null
done
# gVisor sandboxes (sentry, gofer) of the runsc handler, by their state root.
for p in $(pgrep -f -- "--root=$DATA/run/runsc" 2>/dev/null) $(pgrep -f -- "--root $DATA/run/runsc" 2>/dev/null); do
  kill -9 "$p" 2>/dev/null
done
# Processes still in the pod cgroups.
for d in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
  [ -d "$d" ] || continue
  find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -9 2>/dev/null
done
sleep 0.2

log "processes gone"
# Mounts below the data dir (overlay rootfs, shm, secrets, emptyDirs), deepest first.
for m in $(awk -v p="$DATA/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m"
done
# Network namespaces the CRI made (cni-<uuid>), the bridge and its veths.
for ns in /run/netns/cni-*; do
  [ -e "$ns" ] || continue
  umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null
  rm -f "$ns"
done
ip link del "$BRIDGE" 2>/dev/null
log "mounts, netns, bridge removed"
# iptables chains the kubelet made (KUBE-*), and the rules jumping to them.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for t in filter nat mangle; do
    chains=$("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}')
    [ -n "$chains" ] || continue
    for ch in $chains; do
      "$ipt" -t "$t" -S 2>/dev/null | awk -v c="$ch" '$1 == "-A" && $0 ~ ("-j " c "( |$)") {sub(/^-A/, "-D"); print}' |
        while read -r rule; do eval "$ipt -t $t $rule" 2>/dev/null; done
    done
    for ch in $chains; do "$ipt" -t "$t" -F "$ch" 2>/dev/null; done
    for ch in $chains; do "$ipt" -t "$t" -X "$ch" 2>/dev/null; done
  done
done
# kube-proxy's nftables tables (nftables mode keeps everything in these).
if command -v nft >/dev/null; then
  for fam in ip ip6; do nft delete table "$fam" kube-proxy 2>/dev/null; done
fi
# Pod cgroups, deepest first.
for d in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
  [ -d "$d" ] || continue
  find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$d" ] && log "cgroup $d still busy"
done
# What the kubelet writes outside its root dir whatever --root-dir says.
if [ -e "$DATA/run/created-var-lib-kubelet" ]; then rm -rf /var/lib/kubelet; fi
if [ -e "$DATA/run/created-var-log-containers" ]; then rm -rf /var/log/containers; fi
# containerd's shim socket dir, when up.sh made it and no other containerd runs.
if [ -e "$DATA/run/created-run-containerd" ] && ! pgrep -x containerd >/dev/null; then rm -rf /run/containerd; fi
rm -rf "$DATA"
log "removed $DATA"
