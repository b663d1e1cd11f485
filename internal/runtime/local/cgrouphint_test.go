package local

import (
	"strings"
	"testing"
)

func TestFavordynmodsHint(t *testing.T) {
	hybrid := "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n" +
		"cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
	for _, c := range []struct {
		mounts string
		want   string // a part of the hint; "" none
	}{
		{hybrid + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n", "remount,favordynmods /sys/fs/cgroup/unified"},
		{hybrid + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime,favordynmods 0 0\n", ""},
		{hybrid + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,favordynmods,relatime 0 0\n", ""},
		{"cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n", ""}, // pure v2: runsc clones into the cgroup
		{hybrid, ""}, // no cgroup2 mount to set it on
		{"", ""},
	} {
		got := favordynmodsHint(c.mounts)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("favordynmodsHint(%q) = %q, want it to contain %q", c.mounts, got, c.want)
		}
	}
}
