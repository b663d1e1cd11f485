package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// evilImages serves busybox plus a layer of the test's as "evil-dir" and "evil-file".
type evilImages struct {
	testImages
	layers map[string]string // ref -> extra layer dir
}

func (ei evilImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	extra, ok := ei.layers[ref]
	if !ok {
		return ei.testImages.Pull(ctx, ref, creds)
	}
	img, err := ei.testImages.Pull(ctx, "busybox", creds)
	if err == nil {
		img.Ref, img.Digest = ref, "sha256:e7e7"+strings.ReplaceAll(ref, "-", "")
		img.Layers = append(append([]string(nil), img.Layers...), extra)
	}
	return img, err
}

// TestSandboxdDirFromImageIgnored: an image's /.sandboxd never decides what the runtime
// executes as pid 1 or which seccomp filter the agent installs. runc resolves mount
// destinations following symlinks, and volumes are mounted after the agent's files:
// with /.sandboxd a symlink to /data (a volume, written earlier by the same org, holding
// bin/sandbox-agent), or /.sandboxd/seccomp.bpf a symlink to /data/f.bpf (an allow-all
// program), the volume would hide the real files. The backend makes /.sandboxd afresh
// before runc runs: the sandbox runs the real agent, under the real filter (unshare
// refused; pid 1 Seccomp 2), and neither planted file is used.
func TestSandboxdDirFromImageIgnored(t *testing.T) {
	e := newEnv(t)
	if why := e.b.ManagedUnavailable(); why != "" {
		t.Skip(why)
	}
	// The layers: the image's own /.sandboxd.
	dirLayer, fileLayer := t.TempDir(), t.TempDir()
	if err := os.Symlink("/data", filepath.Join(dirLayer, ".sandboxd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(fileLayer, ".sandboxd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/data/f.bpf", filepath.Join(fileLayer, ".sandboxd", "seccomp.bpf")); err != nil {
		t.Fatal(err)
	}
	e.b.cfg.Images = evilImages{testImages{layers: []string{busyboxDir}}, map[string]string{"evil-dir": dirLayer, "evil-file": fileLayer}}

	// The volume, as an earlier sandbox of the org left it.
	name := runtime.ManagedVolumeName("acme", "data")
	if _, err := e.b.EnsureManaged(name, 64<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.b.RemoveManaged(name) })
	root, err := e.b.managedRoot(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "sandbox-agent"), []byte("#!/bin/sh\necho planted > /data/ran\nexec sleep 3600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	allowAll := []byte{0x06, 0, 0, 0, 0, 0, 0xff, 0x7f} // BPF_RET|BPF_K SECCOMP_RET_ALLOW
	if err := os.WriteFile(filepath.Join(root, "f.bpf"), allowAll, 0o444); err != nil {
		t.Fatal(err)
	}

	spec := func(id, img string) runtime.Spec {
		return runtime.Spec{ID: id,
			Container: runtime.Container{Image: img, Command: "sleep", Args: []string{"3600"}, VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}},
			Volumes:   []runtime.Volume{{Name: "data", Managed: name}}}
	}
	// The first sandbox of the profile has runc compile the filter, which is kept: the
	// next ones get the agent-installed program (the path the symlinks aim at).
	e.create(runtime.Spec{ID: "sbd-first", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	defer func() { _ = e.b.Destroy(context.Background(), "sbd-first") }()
	for _, id := range []string{"sbd-dir", "sbd-file"} {
		img := map[string]string{"sbd-dir": "evil-dir", "sbd-file": "evil-file"}[id]
		e.create(spec(id, img))
		defer func() { _ = e.b.Destroy(context.Background(), id) }()
		c := agentClient(e.b, id)
		for _, ch := range []struct {
			argv []string
			want string
		}{
			{[]string{"sh", "-c", "grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs):' /proc/1/status | tr -s '\\t' ' '"}, "NoNewPrivs: 1\nSeccomp: 2\nSeccomp_filters: 1"},
			{[]string{"sh", "-c", "unshare -U true 2>&1; echo rc=$?"}, "unshare: unshare(0x10000000): Operation not permitted\nrc=1"},
			{[]string{"sh", "-c", "test -d /.sandboxd && ! test -L /.sandboxd && ! test -L /.sandboxd/seccomp.bpf && echo real"}, "real"},
			{[]string{"sh", "-c", "cat /proc/1/comm"}, agentComm},
			// Owned by the sandbox's root (mapped, in its user namespace), as runc makes it.
			{[]string{"stat", "-c", "%u:%g %a", "/.sandboxd"}, "0:0 755"},
		} {
			out, errOut, code := execIn(t, c, ch.argv...)
			if strings.TrimSpace(out) != ch.want {
				t.Errorf("%s: %q: %q (stderr %q, exit %d), want %q", id, ch.argv, out, errOut, code, ch.want)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "ran")); err == nil {
			t.Errorf("%s: the volume's planted agent ran", id)
		}
	}
}

// TestFreshSandboxdDir: whatever is at <rootfs>/.sandboxd (a symlink, to a directory
// outside; a directory holding symlinks) is removed, not followed, and replaced by an
// empty 0755 directory owned by the sandbox's root.
func TestFreshSandboxdDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	for _, c := range []struct {
		name  string
		ids   *idRange
		plant func(t *testing.T, rootfs, outside string)
	}{
		{"symlink", nil, func(t *testing.T, rootfs, outside string) {
			if err := os.Symlink(outside, filepath.Join(rootfs, ".sandboxd")); err != nil {
				t.Fatal(err)
			}
		}},
		{"dir of symlinks", &idRange{HostID: idRangeBase, Size: idRangeSize}, func(t *testing.T, rootfs, outside string) {
			if err := os.MkdirAll(filepath.Join(rootfs, ".sandboxd", "bin"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "f.bpf"), filepath.Join(rootfs, ".sandboxd", "seccomp.bpf")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(rootfs, ".sandboxd", "bin", "out")); err != nil {
				t.Fatal(err)
			}
		}},
		{"nothing", nil, func(*testing.T, string, string) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rootfs, outside := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(outside, "f.bpf"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			c.plant(t, rootfs, outside)
			if err := freshSandboxdDir(rootfs, c.ids); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("outside changed: %v", ents)
			}
			fi, err := os.Lstat(filepath.Join(rootfs, ".sandboxd"))
			if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
				t.Fatalf("/.sandboxd: %v, %v", fi, err)
			}
			want := uint32(0)
			if c.ids != nil {
				want = c.ids.HostID
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || st.Gid != want {
				uid, gid := st.Uid, st.Gid
				t.Errorf("owned by %d:%d, want %d", uid, gid, want)
			}
			if ents, _ := os.ReadDir(filepath.Join(rootfs, ".sandboxd")); len(ents) != 0 {
				t.Errorf("not empty: %v", ents)
			}
		})
	}
}

// TestFreshSandboxdDirBounded: an image with more entries under /.sandboxd than
// freshSandboxdDir removes is refused (invalid spec) before any is removed: each would
// cost a whiteout in the sandbox's upper layer.
func TestFreshSandboxdDirBounded(t *testing.T) {
	rootfs := t.TempDir()
	dir := filepath.Join(rootfs, ".sandboxd")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range maxSandboxdEntries + 1 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := freshSandboxdDir(rootfs, nil); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("%d entries: %v", maxSandboxdEntries+1, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != maxSandboxdEntries+1 {
		t.Errorf("%d entries left, want all %d", len(ents), maxSandboxdEntries+1)
	}
	if err := os.Remove(filepath.Join(dir, "0")); err != nil {
		t.Fatal(err)
	}
	if err := freshSandboxdDir(rootfs, nil); err != nil && os.Geteuid() == 0 {
		t.Fatalf("%d entries: %v", maxSandboxdEntries, err)
	}
}
