package local

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestOpenBeneath: a sub_path of a managed volume is made when missing (0777), opened
// by descriptor, and refused when any component is a symlink (to a dir inside or outside
// the volume) or a file: the tree is sandbox-written.
func TestOpenBeneath(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "in", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"esc": outside, "rel": "../../", "inner": "in", "dot": "."} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "in", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := openBeneath(root, "made/new")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st, err := os.Stat(filepath.Join(root, "made", "new")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o777 {
		t.Fatalf("made = %v, %v", st, err)
	}
	if f, err := openBeneath(root, "in/deep"); err != nil {
		t.Fatal(err)
	} else {
		f.Close()
	}
	for _, sub := range []string{"esc", "esc/x", "rel", "inner", "inner/deep", "dot", "in/link", "in/link/y", "file", "file/z", ".."} {
		f, err := openBeneath(root, sub)
		if err == nil {
			f.Close()
			t.Errorf("sub_path %q opened", sub)
			continue
		}
		if sub != ".." && sub != "file/z" && !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("sub_path %q: %v, want ErrInvalidSpec", sub, err)
		}
	}
	// Nothing was made outside.
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made outside the volume: %v", ents)
	}
}

// TestManagedVolumeImage: EnsureManaged makes a sparse, size-limited ext4 image once,
// mounts it once (idempotent; again after an unmount, as after a host reboot) and keeps
// its content; RemoveManaged unmounts and deletes it.
func TestManagedVolumeImage(t *testing.T) {
	testenv.RequireRoot(t, "loop devices and mounts")
	state := t.TempDir()
	b := &Backend{cfg: Config{StateDir: state}, disks: &diskTemplates{dir: filepath.Join(state, diskTemplatesDir)}}
	if why := b.ManagedUnavailable(); why != "" {
		t.Skip(why)
	}
	name := runtime.ManagedVolumeName("acme", "data")
	if _, err := b.EnsureManaged("../x", 0); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := b.EnsureManaged(name, 1<<10); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("tiny: %v", err)
	}
	if _, err := b.managedRoot(name); err == nil {
		t.Fatal("a sandbox could mount a volume never made")
	}
	n, err := b.EnsureManaged(name, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.RemoveManaged(name) })
	if n != 64<<20 {
		t.Fatalf("capacity %d", n)
	}
	root, err := b.managedRoot(name)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(root); err != nil || st.Mode().Perm() != 0o777 {
		t.Fatalf("root = %v, %v", st, err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("fresh volume holds %v", ents)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Ensure again, and after an unmount (a host reboot): one mount, content kept.
	if _, err := b.EnsureManaged(name, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := unmountAll(root); err != nil {
		t.Fatal(err)
	}
	if root, err = b.managedRoot(name); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(got) != "kept" {
		t.Fatalf("after remount: %q %v", got, err)
	}
	if mps, _ := mountinfo.Under(filepath.Join(state, dirManaged)); len(mps) != 1 {
		t.Fatalf("mounts: %v", mps)
	}
	for _, l := range LoopDevicesUnder(state) {
		dio, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(l.Dev), "loop", "dio"))
		t.Logf("%s backs %s: direct I/O %s (0 where the state dir's filesystem cannot)", l.Dev, l.File, strings.TrimSpace(string(dio)))
	}
	// Size-limited: a write past the size fails.
	if err := os.WriteFile(filepath.Join(root, "big"), make([]byte, 80<<20), 0o644); err == nil {
		t.Fatal("wrote 80 MiB into a 64 MiB volume")
	}
	_ = os.Remove(filepath.Join(root, "big"))
	// Growing, mounted: a smaller size changes nothing; a larger one grows the image and
	// the filesystem online, content kept; the 80 MiB fit then.
	if n, err := b.EnsureManaged(name, 32<<20); err != nil || n != 64<<20 {
		t.Fatalf("shrink = %d, %v", n, err)
	}
	if n, err := b.EnsureManaged(name, 256<<20); err != nil || n != 256<<20 {
		t.Fatalf("grow = %d, %v", n, err)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(root, &sf); err != nil || int64(sf.Blocks)*sf.Bsize < 200<<20 {
		t.Fatalf("filesystem after grow: %d blocks of %d, %v", sf.Blocks, sf.Bsize, err)
	}
	if err := os.WriteFile(filepath.Join(root, "big"), make([]byte, 80<<20), 0o644); err != nil {
		t.Fatalf("80 MiB into the grown volume: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(got) != "kept" {
		t.Fatalf("after grow: %q %v", got, err)
	}
	if n, err := b.EnsureManaged(name, 256<<20); err != nil || n != 256<<20 {
		t.Fatalf("ensure again = %d, %v", n, err)
	}
	// While a sandbox holds it (bindManaged, as a sandbox's setup binds it): grown online
	// where the runner may (CAP_SYS_RESOURCE), else refused ErrManagedBusy, unchanged.
	held := filepath.Join(t.TempDir(), "vol")
	if err := b.bindManaged(name, held); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(held, "f")); err != nil || string(got) != "kept" {
		t.Fatalf("through the sandbox's bind: %q %v", got, err)
	}
	n, err = b.EnsureManaged(name, 512<<20)
	_ = unix.Unmount(held, unix.MNT_DETACH)
	switch {
	case err == nil && n == 512<<20:
		t.Log("grown online")
	case errors.Is(err, runtime.ErrManagedBusy):
		t.Logf("grow refused while held: %v", err)
		if n, err := b.EnsureManaged(name, 256<<20); err != nil || n != 256<<20 {
			t.Fatalf("capacity after a refused grow = %d, %v", n, err)
		}
		if got, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(got) != "kept" {
			t.Fatalf("after refused grow: %q %v", got, err)
		}
	default:
		t.Fatalf("grow while held = %d, %v", n, err)
	}
	if err := b.RemoveManaged(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, dirManaged, name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after remove: %v", err)
	}
	if mps, _ := mountinfo.Under(state); len(mps) != 0 {
		t.Fatalf("left mounted: %v", mps)
	}
	if err := b.RemoveManaged(name); err != nil {
		t.Fatalf("remove again: %v", err)
	}
}
