#!/bin/sh
# cgroup-v1-ns.sh CMD [ARGS...]: runs CMD in a private mount namespace whose
# /sys/fs/cgroup holds the host's cgroup v1 hierarchies only (no cgroup2 "unified").
#
# crun (1.8, Debian 12) refuses a hybrid host whose cgroup2 mount has any controller
# ("cgroups in hybrid mode not supported"): on this VM hugetlb sits on cgroup2 while
# every other controller is v1. The same v1 hierarchies are mounted again (the
# kernel hands back the existing ones: the same cgroups), so sandboxes are accounted
# and limited exactly as under runc; nothing changes outside the namespace. A host
# with cgroup v2 only, or v1 only, needs none of this. See docs/oci-runtime.md.
set -eu
if [ "${SBX_CGROUP_V1_NS:-}" != "$$" ]; then
	# The re-exec'd shell keeps this pid (exec), and the variable names it: a variable set
	# by hand or inherited never skips the unshare.
	SBX_CGROUP_V1_NS=$$ exec unshare --mount --propagation private -- "$0" "$@"
fi
# Never touch the host's own /sys/fs/cgroup: refuse unless in a mount namespace of our own.
if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
	echo "cgroup-v1-ns.sh: not in a private mount namespace; refusing to replace /sys/fs/cgroup" >&2
	exit 1
fi
tmp=$(mktemp -d)
# Keep the host's hierarchies reachable while /sys/fs/cgroup is replaced.
mount --rbind /sys/fs/cgroup "$tmp"
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for d in "$tmp"/*; do
	n=$(basename "$d")
	[ "$(stat -f -c %T "$d")" = cgroupfs ] || continue # v1 hierarchies only
	mkdir -p "/sys/fs/cgroup/$n"
	mount --bind "$d" "/sys/fs/cgroup/$n"
done
umount -l "$tmp"
rmdir "$tmp"
unset SBX_CGROUP_V1_NS
exec "$@"
