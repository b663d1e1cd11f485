package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// standbyAgent is an agent in standby: it answers Status (and counts the calls), once
// hold (if any) is closed: until then its container is "not created yet".
type standbyAgent struct {
	stopAgent
	statuses atomic.Int32
	hold     chan struct{}
}

func (a *standbyAgent) Status(ctx context.Context, _ *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	a.statuses.Add(1)
	if a.hold != nil {
		select {
		case <-a.hold:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeUnavailable, ctx.Err())
		}
	}
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
	primary := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}, hold: make(chan struct{})}
	side := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}, hold: make(chan struct{})}
	b, s, dir := behindGateWithFiller(t, ctx, primary, sidecarAgent{name: "side", handler: side})
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
	// The writer mounts sub_path "data" read-write at /data and "data/ro/x" read-only; the
	// sidecar "side" sub_path "side" read-only.
	setSpec := func(digest string) []restore {
		t.Helper()
		spec := writerSpec(digest)
		spec.ID = "x"
		spec.Container.VolumeMounts[1].SubPath = "data"
		spec.Container.VolumeMounts = append(spec.Container.VolumeMounts, runtime.VolumeMount{Volume: "g", Path: "/ro", ReadOnly: true, SubPath: "data/ro/x"})
		spec.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh",
			VolumeMounts: []runtime.VolumeMount{{Volume: "g", Path: "/side", ReadOnly: true, SubPath: "side"}}}}
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
		for _, sub := range []string{"data", "data/ro/x", "side"} {
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
	if r := plan[0]; r.container != containerFiller || !slices.Equal(r.subDirs, []string{"data", "data/ro/x", "side"}) || !slices.Equal(r.waitFor, []string{"", "side"}) {
		t.Errorf("plan %+v: want the filler, sub_dirs data, data/ro/x and side, after the primary and the sidecar", r)
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
	filled := make(chan error, 1)
	go func() { filled <- b.runRestores(ctx, s, plan) }()
	// Not filled while a container mounting a sub_path has not answered (its directory
	// may not be made yet): first the primary, then the sidecar.
	untouched := func(what string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		select {
		case err := <-filled:
			t.Fatalf("the fill ended (%v) before %s answered", err, what)
		default:
		}
		if _, err := os.Lstat(filepath.Join(copyDir, "top.txt")); err == nil {
			t.Fatalf("the copy was filled before %s answered", what)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); primary.statuses.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the primary was never asked")
		}
	}
	untouched("the primary")
	close(primary.hold)
	untouched("the sidecar")
	if side.statuses.Load() == 0 {
		t.Error("the sidecar (which mounts a sub_path) was not asked")
	}
	close(side.hold)
	if err := <-filled; err != nil {
		t.Fatalf("fill with sub_path mounts: %v", err)
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
	// Not the spec's fault (an older agent ignoring sub_dirs says the same): an internal
	// error naming what was found and hinting at the agent image.
	if err := b.runRestores(ctx, s, plan); err == nil || errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "not empty") ||
		!strings.Contains(err.Error(), "data/planted") || !strings.Contains(err.Error(), "agent image older") {
		t.Errorf("a copy not empty before the fill: %v, want an internal error naming data/planted and the agent image", err)
	}

	// The writer's commit: the whole copy through the filler, checked as any Pod archive
	// (the Pod's workload here: the primary alone).
	b.mu.Lock()
	s.spec.Sidecars = nil
	b.mu.Unlock()
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

// TestSubPathsMadeByRuntime: the directories the kubelet and the container runtime make
// in a GLOBAL copy when they create a container (subPaths): each mount's sub_path, a
// working directory below a mount of the volume, and a nested mount point below one,
// as paths inside the copy (the mount's sub_path joined); the containers making them
// are waited for. A path whose deepest mount is another volume's is not the copy's.
func TestSubPathsMadeByRuntime(t *testing.T) {
	g := func(p, sub string) runtime.VolumeMount {
		return runtime.VolumeMount{Volume: "g", Path: p, SubPath: sub}
	}
	sc := func(p string) runtime.VolumeMount { return runtime.VolumeMount{Volume: "s", Path: p} }
	for _, tc := range []struct {
		name          string
		primary       runtime.Container
		sidecars      []runtime.Container
		dirs, waitFor []string
	}{
		{"root mount, nothing below", runtime.Container{WorkingDir: "/w", VolumeMounts: []runtime.VolumeMount{g("/data", "")}}, nil, nil, nil},
		{"working directory below a root mount", runtime.Container{WorkingDir: "/data/work/x", VolumeMounts: []runtime.VolumeMount{g("/data", "")}}, nil,
			[]string{"work/x"}, []string{""}},
		{"working directory at the mount", runtime.Container{WorkingDir: "/data", VolumeMounts: []runtime.VolumeMount{g("/data", "")}}, nil, nil, nil},
		{"working directory below a sub_path mount", runtime.Container{WorkingDir: "/data/w", VolumeMounts: []runtime.VolumeMount{g("/data", "s/t")}}, nil,
			[]string{"s/t", "s/t/w"}, []string{""}},
		{"working directory below a '.' mount", runtime.Container{WorkingDir: "/d/w", VolumeMounts: []runtime.VolumeMount{g("/d", ".")}}, nil,
			[]string{"w"}, []string{""}},
		{"nested mount of another volume", runtime.Container{WorkingDir: "/data/cache/x", VolumeMounts: []runtime.VolumeMount{g("/data", "s"), sc("/data/cache")}}, nil,
			[]string{"s", "s/cache"}, []string{""}},
		{"nested mount of the volume", runtime.Container{VolumeMounts: []runtime.VolumeMount{g("/data", ""), g("/data/a/b", "elsewhere")}}, nil,
			[]string{"elsewhere", "a/b"}, []string{""}},
		{"another volume's mount holds the volume's", runtime.Container{WorkingDir: "/x/y/z", VolumeMounts: []runtime.VolumeMount{sc("/x"), g("/x/y", "")}}, nil,
			[]string{"z"}, []string{""}},
		{"relative working directory ignored", runtime.Container{WorkingDir: "data/w", VolumeMounts: []runtime.VolumeMount{g("/data", "")}}, nil, nil, nil},
		{"a sidecar's", runtime.Container{VolumeMounts: []runtime.VolumeMount{g("/data", "")}},
			[]runtime.Container{{Name: "side", WorkingDir: "/g/w", VolumeMounts: []runtime.VolumeMount{g("/g", "")}}, {Name: "other", VolumeMounts: []runtime.VolumeMount{g("/g", "")}}},
			[]string{"w"}, []string{"side"}},
	} {
		spec := &runtime.Spec{Container: tc.primary, Sidecars: tc.sidecars}
		dirs, waitFor, err := subPaths(spec, "g")
		if err != nil || !slices.Equal(dirs, tc.dirs) || !slices.Equal(waitFor, tc.waitFor) {
			t.Errorf("%s: dirs %q wait for %q (%v), want %q and %q", tc.name, dirs, waitFor, err, tc.dirs, tc.waitFor)
		}
	}
	// Below a read-only mount the runtime cannot make them (EROFS): refused, naming the
	// container and the field; a read-only sub_path mount alone is the kubelet's, taken.
	ro := func(p, sub string) runtime.VolumeMount { m := g(p, sub); m.ReadOnly = true; return m }
	for name, c := range map[string]runtime.Container{
		"working_dir":                {Name: "app", WorkingDir: "/data/w", VolumeMounts: []runtime.VolumeMount{ro("/data", "s")}},
		"volume_mounts[].mount_path": {Name: "app", VolumeMounts: []runtime.VolumeMount{ro("/data", ""), sc("/data/cache")}},
	} {
		_, _, err := subPaths(&runtime.Spec{Container: c}, "g")
		if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "app") || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("below a read-only mount, %s: %v, want ErrInvalidSpec naming the container and the field", name, err)
		}
	}
	if dirs, _, err := subPaths(&runtime.Spec{Container: runtime.Container{WorkingDir: "/data", VolumeMounts: []runtime.VolumeMount{ro("/data", "s"), ro("/other", "t")}}}, "g"); err != nil || !slices.Equal(dirs, []string{"s", "t"}) {
		t.Errorf("read-only sub_path mounts: %q, %v", dirs, err)
	}

	// More than fsarchive.MaxExisting of them for one volume: refused before the Pod.
	b := snapBackend(t, 0)
	d := prepareEmpty(t, b)
	spec := globalSpec(d)
	for i := range fsarchive.MaxExisting {
		spec.Container.VolumeMounts = append(spec.Container.VolumeMounts, runtime.VolumeMount{Volume: "g", Path: fmt.Sprintf("/m%d", i), ReadOnly: true, SubPath: fmt.Sprintf("d%d", i)})
	}
	if plan, rel, err := b.planRestores(spec); err != nil || len(plan) != 1 || len(plan[0].subDirs) != fsarchive.MaxExisting {
		t.Errorf("%d sub_dirs: %v, %v", fsarchive.MaxExisting, plan, err)
	} else {
		rel()
	}
	spec.Container.VolumeMounts = append(spec.Container.VolumeMounts, runtime.VolumeMount{Volume: "g", Path: "/one-more", ReadOnly: true, SubPath: "one-more"})
	if _, rel, err := b.planRestores(spec); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "working_dir") || !strings.Contains(err.Error(), `"g"`) ||
		!strings.Contains(err.Error(), "at most 64") {
		t.Errorf("%d sub_dirs: %v, want ErrInvalidSpec naming the volume and the fields", fsarchive.MaxExisting+1, err)
	} else {
		rel()
	}
}

// prepareEmpty caches an empty volume's archive in b and returns its digest.
func prepareEmpty(t *testing.T, b *Backend) string {
	t.Helper()
	data := archiveOf(t, func(string) {})
	d := digestOfBytes(data)
	open := func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	if err := b.PrepareSnapshot(context.Background(), d, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100}, open); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestGlobalVolumeSubPathWaitDeadline: the wait before the fill (the filler, then every
// container making directories in the copy) has one StartTimeout for all of them, not one
// each: a sidecar answering after it is a start failure even though each container
// answered within StartTimeout of the previous one.
func TestGlobalVolumeSubPathWaitDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	primary := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}, hold: make(chan struct{})}
	side := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}, hold: make(chan struct{})}
	b, s, dir := behindGateWithFiller(t, ctx, primary, sidecarAgent{name: "side", handler: side})
	data := archiveOf(t, func(root string) { must(t, os.WriteFile(filepath.Join(root, "f"), nil, 0o644)) })
	d := digestOfBytes(data)
	open := func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	if err := b.PrepareSnapshot(ctx, d, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100}, open); err != nil {
		t.Fatal(err)
	}
	spec := writerSpec(d)
	spec.ID = "x"
	spec.Container.VolumeMounts[1].SubPath = "data"
	spec.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh",
		VolumeMounts: []runtime.VolumeMount{{Volume: "g", Path: "/side", ReadOnly: true, SubPath: "side"}}}}
	b.mu.Lock()
	s.spec = *spec
	b.mu.Unlock()
	plan, rel, err := b.planRestores(spec)
	defer rel()
	if err != nil || len(plan) != 1 || !slices.Equal(plan[0].waitFor, []string{"", "side"}) {
		t.Fatalf("plan %+v, %v", plan, err)
	}
	plan[0].path = filepath.Join(dir, "copy")
	for _, sub := range []string{"data", "side"} {
		must(t, os.MkdirAll(filepath.Join(plan[0].path, sub), 0o777))
	}
	b.cfg.StartTimeout = time.Second
	time.AfterFunc(700*time.Millisecond, func() { close(primary.hold) })
	time.AfterFunc(1300*time.Millisecond, func() { close(side.hold) })
	start := time.Now()
	err = b.runRestores(ctx, s, plan)
	if err == nil || !strings.Contains(err.Error(), "did not all answer within 1s") {
		t.Fatalf("a sidecar answering %s after the wait began: %v, want the one deadline's error", time.Since(start), err)
	}
	if _, serr := os.Lstat(filepath.Join(plan[0].path, "f")); serr == nil {
		t.Error("filled anyway")
	}
}
