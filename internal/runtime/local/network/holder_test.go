//go:build linux

package network

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hostMountsUnder lists the mount points of this process's mount namespace below dir.
func hostMountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestHolderKeepsHostMountTable: a sandbox's network namespace adds no mount to the
// host's mount table (the one runc reads and copies on every create): the only mount
// of the state dir is the holder's, however many sandboxes there are; the namespaces
// stay reachable at NetNSPath, outlive the Manager (a crash) and a new Manager finds
// them; Cleanup removes the holder and with it every namespace.
func TestHolderKeepsHostMountTable(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, false)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(m.stateDir, "mntns")}
	if got := hostMountsUnder(t, m.stateDir); !slices.Equal(got, want) {
		t.Fatalf("host mounts under the state dir after New: %v, want %v", got, want)
	}
	var ids []string
	for range 3 {
		id := "hk-" + randHex(4)
		noteLink(vethName(m.cfg.Bridge, id))
		a, err := m.Setup(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if a.NetNSPath != filepath.Join(m.stateDir, "netns", id) || !isNSFS(a.NetNSPath) {
			t.Fatalf("NetNSPath %s: not a namespace", a.NetNSPath)
		}
		ids = append(ids, id)
	}
	if got := hostMountsUnder(t, m.stateDir); !slices.Equal(got, want) {
		t.Errorf("host mounts under the state dir with 3 sandboxes: %v, want %v", got, want)
	}
	slices.Sort(ids)
	held, err := HeldNetNS(m.stateDir)
	slices.Sort(held)
	if err != nil || !slices.Equal(held, ids) {
		t.Errorf("HeldNetNS: %v %v, want %v", held, err, ids)
	}
	// The link goes through the anchor thread's root to a dir named at random (a
	// recycled pid and tid's root cannot hold it); a later Manager finds the same dir.
	target, err := os.Readlink(filepath.Join(m.stateDir, "netns"))
	if err != nil || !regexp.MustCompile(`^/proc/[0-9]+/task/[0-9]+/root/ns-[0-9a-f]{32}$`).MatchString(target) {
		t.Fatalf("netns link %q %v", target, err)
	}
	// The runner goes (its anchor thread and fds with it): the namespaces stay.
	m.Close()
	m2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if t2, _ := os.Readlink(filepath.Join(m.stateDir, "netns")); filepath.Base(t2) != filepath.Base(target) {
		t.Errorf("after restart the link names %s, before %s", t2, target)
	}
	for _, id := range ids {
		a, err := m2.Lookup(id)
		if err != nil {
			t.Fatalf("Lookup(%s) after restart: %v", id, err)
		}
		if err := inNetNS(a.NetNSPath, func() error {
			_, err := os.Stat("/proc/self/net/dev")
			return err
		}); err != nil {
			t.Errorf("enter %s after restart: %v", a.NetNSPath, err)
		}
	}
	if err := m2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := hostMountsUnder(t, m2.stateDir); len(got) != 0 {
		t.Errorf("host mounts under the state dir after Cleanup: %v", got)
	}
	if held, err := HeldNetNS(m2.stateDir); err != nil || len(held) != 0 {
		t.Errorf("HeldNetNS after Cleanup: %v %v", held, err)
	}
}

// TestHolderMigratesLegacyLayout: a state dir of the previous layout (netns/ a shared
// bind mount with one bind mount per sandbox on the host) has its namespaces moved into
// the holder by New: the same namespace at the same path, no host mount left there.
func TestHolderMigratesLegacyLayout(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, false)
	dir := filepath.Join(cfg.StateDir, "netns")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("none", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	id := "legacy-" + randHex(3)
	p := filepath.Join(dir, id)
	if err := createNetNS(p); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Stat(p, &before); err != nil {
		t.Fatal(err)
	}
	m := newManagerFrom(t, cfg)
	if got, want := hostMountsUnder(t, m.stateDir), []string{filepath.Join(m.stateDir, "mntns")}; !slices.Equal(got, want) {
		t.Errorf("host mounts after migration: %v, want %v", got, want)
	}
	var after unix.Stat_t
	if err := unix.Stat(m.NetNSPath(id), &after); err != nil || after.Ino != before.Ino || !isNSFS(m.NetNSPath(id)) {
		t.Errorf("namespace after migration: ino %d (before %d), %v", after.Ino, before.Ino, err)
	}
	if held, _ := HeldNetNS(m.stateDir); !slices.Equal(held, []string{id}) {
		t.Errorf("HeldNetNS: %v", held)
	}
}
