package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// standbyAgent is a primary agent in standby: it answers Status (and counts the calls).
type standbyAgent struct {
	stopAgent
	statuses atomic.Int32
}

func (a *standbyAgent) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	a.statuses.Add(1)
	return connect.NewResponse(&agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_STANDBY}), nil
}

// archiveOf archives a tree made by mk (fsarchive.Write: symlinks as symlinks).
func archiveOf(t *testing.T, mk func(root string)) []byte {
	t.Helper()
	root := t.TempDir()
	mk(root)
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := fsarchive.Write(context.Background(), f, &buf, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() {
		t.Fatalf("%s is %v, not a directory", p, fi.Mode())
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestGlobalVolumeSubPathFill: a GLOBAL copy mounted with sub_paths on Kubernetes
// (through a real gate and a real filler agent). The Pod mounts the sub-directory in the
// workload (the kubelet's subPath) and the whole copy in the filler; the runner is no
// longer refused it (no NoGlobalVolumeSubPaths). The restore waits for the containers
// mounting a sub_path (their agents answer: the kubelet made the sub-directories, here
// made by the test as the kubelet does, in the empty copy), then fills the copy into
// those very directories (same inode: the mounts show the content); a sub_path missing
// from the archive stays the kubelet's empty directory; the writer's commit archives the
// whole copy, not only the sub-directory. An archive making the sub_path a symlink (to a
// canary outside) or a file, or one on the way to it, is refused as ErrInvalidSpec naming
// it: nothing is written through the symlink, the copy is cleared; so is a copy holding
// anything besides the kubelet's directories before the fill.
func TestGlobalVolumeSubPathFill(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	primary := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}}
	b, s, dir := behindGateWithFiller(t, ctx, primary)
	if b.Support().NoGlobalVolumeSubPaths {
		t.Error("Support: NoGlobalVolumeSubPaths, want sub_path mounts of GLOBAL volumes taken")
	}
	canary := t.TempDir()

	prepare := func(data []byte) string {
		t.Helper()
		d := digestOfBytes(data)
		open := func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		if err := b.PrepareSnapshot(ctx, d, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100}, open); err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The writer mounts sub_path "data" read-write at /data and "data/ro/x" read-only.
	setSpec := func(digest string) []restore {
		t.Helper()
		spec := writerSpec(digest)
		spec.ID = "x"
		spec.Container.VolumeMounts[1].SubPath = "data"
		spec.Container.VolumeMounts = append(spec.Container.VolumeMounts, runtime.VolumeMount{Volume: "g", Path: "/ro", ReadOnly: true, SubPath: "data/ro/x"})
		if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		s.spec = *spec
		b.mu.Unlock()
		plan, rel, err := b.planRestores(spec)
		t.Cleanup(rel)
		if err != nil || len(plan) != 1 {
			t.Fatalf("plan %+v, %v", plan, err)
		}
		return plan
	}
	// kubelet makes the sub-directories (and parents) as the kubelet does, in an empty copy.
	kubelet := func(name string) string {
		t.Helper()
		copyDir := filepath.Join(dir, name)
		for _, sub := range []string{"data", "data/ro/x"} {
			if err := os.MkdirAll(filepath.Join(copyDir, sub), 0o777); err != nil {
				t.Fatal(err)
			}
		}
		return copyDir
	}

	// The Pod: the workload mounts the sub-directories; the filler the whole copy.
	good := prepare(archiveOf(t, func(root string) {
		must(t, os.MkdirAll(filepath.Join(root, "data", "sub"), 0o750))
		must(t, os.WriteFile(filepath.Join(root, "data", "f.txt"), []byte("in the sub-directory"), 0o644))
		must(t, os.WriteFile(filepath.Join(root, "top.txt"), []byte("outside it"), 0o644))
	}))
	plan := setSpec(good)
	if r := plan[0]; r.container != containerFiller || !slices.Equal(r.subDirs, []string{"data", "data/ro/x"}) || !slices.Equal(r.waitFor, []string{""}) {
		t.Errorf("plan %+v: want the filler, sub_dirs data and data/ro/x, after the primary", r)
	}
	sc, _ := securityFor(nil, "")
	pod := b.podFor(&s.spec, "", b.labels(&s.spec), nil, sc)
	b.addFiller(pod, &s.spec)
	if m := mountAt(containerNamed(pod, containerMain), "/data"); m == nil || m.SubPath != "data" || m.ReadOnly {
		t.Errorf("workload /data %+v, want sub_path data read-write", m)
	}
	if m := mountAt(containerNamed(pod, containerMain), "/ro"); m == nil || m.SubPath != "data/ro/x" || !m.ReadOnly {
		t.Errorf("workload /ro %+v, want sub_path data/ro/x read-only", m)
	}
	if m := mountAt(containerNamed(pod, containerFiller), fillerPath(1)); m == nil || m.SubPath != "" || m.ReadOnly {
		t.Errorf("filler %s %+v, want the whole copy writable", fillerPath(1), m)
	}

	// The fill: after the primary answered, into the kubelet's directories.
	copyDir := kubelet("copy")
	goodCopy := copyDir
	before := ino(t, filepath.Join(copyDir, "data"))
	plan[0].path = copyDir
	if err := b.runRestores(ctx, s, plan); err != nil {
		t.Fatalf("fill with sub_path mounts: %v", err)
	}
	if primary.statuses.Load() == 0 {
		t.Error("the fill did not wait for the primary (which mounts a sub_path)")
	}
	if after := ino(t, filepath.Join(copyDir, "data")); after != before {
		t.Errorf("data is another directory after the fill (inode %d, was %d): the mount would not show it", after, before)
	}
	for name, want := range map[string]string{"data/f.txt": "in the sub-directory", "top.txt": "outside it"} {
		if got, err := os.ReadFile(filepath.Join(copyDir, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(copyDir, "data")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("data: %v, %v; want the archive's mode 0750", fi, err)
	}
	ino(t, filepath.Join(copyDir, "data/ro/x")) // missing from the archive: the kubelet's, kept

	// Hostile archives: the sub_path (or a directory on the way) a symlink or a file.
	for name, mk := range map[string]func(root string){
		"symlink to outside": func(root string) { must(t, os.Symlink(canary, filepath.Join(root, "data"))) },
		"relative symlink": func(root string) {
			must(t, os.MkdirAll(filepath.Join(root, "elsewhere"), 0o755))
			must(t, os.Symlink("elsewhere", filepath.Join(root, "data")))
		},
		"file": func(root string) { must(t, os.WriteFile(filepath.Join(root, "data"), []byte("x"), 0o644)) },
		"symlink on the way": func(root string) {
			must(t, os.MkdirAll(filepath.Join(root, "data"), 0o755))
			must(t, os.Symlink(canary, filepath.Join(root, "data", "ro")))
		},
	} {
		plan := setSpec(prepare(archiveOf(t, mk)))
		copyDir := kubelet("copy-" + strings.ReplaceAll(name, " ", "-"))
		plan[0].path = copyDir
		err := b.runRestores(ctx, s, plan)
		if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "sub_path") ||
			!(strings.Contains(err.Error(), "symlink") || strings.Contains(err.Error(), "regular file")) {
			t.Errorf("%s: %v, want ErrInvalidSpec naming the sub_path and what is there", name, err)
		}
		// Nothing was followed; the agent cleared what the refused fill left (the kubelet's
		// directories too: the sandbox fails, its workload never starts).
		if ents, err := os.ReadDir(copyDir); err != nil || len(ents) != 0 {
			t.Errorf("%s: the copy after the refusal holds %v (%v), want nothing", name, ents, err)
		}
		if ents, _ := os.ReadDir(canary); len(ents) != 0 {
			t.Errorf("%s: written through the symlink: %v", name, ents)
		}
	}

	// A copy holding anything but the kubelet's directories before the fill is refused.
	plan = setSpec(good)
	copyDir = kubelet("copy-planted")
	must(t, os.WriteFile(filepath.Join(copyDir, "data", "planted"), nil, 0o644))
	plan[0].path = copyDir
	if err := b.runRestores(ctx, s, plan); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a copy not empty before the fill: %v", err)
	}

	// The writer's commit: the whole copy through the filler, checked as any Pod archive.
	b.observe(writerPod(true, `{"state":"MAIN_STATE_COMPLETED","exit_code":0}`), false)
	c, err := b.CaptureVolume(ctx, "x", "g")
	if err != nil {
		t.Fatal(err)
	}
	cp := c.(*capture)
	if cp.container != containerFiller || cp.path != fillerPath(1) {
		t.Errorf("capture %+v, want the filler's whole copy %s", cp, fillerPath(1))
	}
	must(t, os.WriteFile(filepath.Join(goodCopy, "data", "written.txt"), []byte("by the writer"), 0o644))
	cp.path = goodCopy
	var arch bytes.Buffer
	if _, err := c.WriteArchive(ctx, &arch); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := fsarchive.Check(ctx, bytes.NewReader(arch.Bytes()), runtime.ArchiveLimits{}); err != nil {
		t.Fatalf("the committed archive: %v", err)
	}
	got := t.TempDir()
	gf, err := os.Open(got)
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	if _, err := fsarchive.Extract(ctx, bytes.NewReader(arch.Bytes()), gf, runtime.ArchiveLimits{}, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"top.txt", "data/f.txt", "data/written.txt", "data/ro/x"} {
		if _, err := os.Lstat(filepath.Join(got, name)); err != nil {
			t.Errorf("the commit lacks %s (want the whole volume): %v", name, err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
