package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// scratchSpec restores scratch volume "w" (1 MiB, medium) from digest d, mounted by the
// primary "app" with mounts.
func scratchSpec(d, medium string, mounts ...runtime.VolumeMount) *runtime.Spec {
	return &runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", VolumeMounts: mounts},
		Volumes: []runtime.Volume{{Name: "w", SizeBytes: 1 << 20, Medium: medium, RestoreDigest: d}}}
}

func wm(p, sub string, ro bool) runtime.VolumeMount {
	return runtime.VolumeMount{Volume: "w", Path: p, SubPath: sub, ReadOnly: ro}
}

// TestScratchRestoreThroughFiller: a scratch volume restored from a snapshot is filled by
// the workload agent mounting its root writable only when no container makes a
// directory in it when created; with a sub_path mount (another container's, or the same
// container's second mount), a working directory or nested mount point below a mount,
// or no writable root mount at all, it goes through the runner's filler with the
// directories the kubelet and the runtime make (the GLOBAL code: fillDirs), waiting for
// the containers making them. The bounds are GLOBAL's: a working directory below a
// read-only mount and more than 64 directories are refused before anything is made. The
// volume's size (the caller's) lifts none of the filler's limits, and a memory volume
// through the filler is refused.
func TestScratchRestoreThroughFiller(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	d := prepareEmpty(t, b)
	side := func(ms ...runtime.VolumeMount) []runtime.Container {
		return []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", VolumeMounts: ms}}
	}
	for _, tc := range []struct {
		name             string
		mounts           []runtime.VolumeMount
		sidecars         []runtime.Container
		workingDir       string
		container, path  string
		subDirs, waitFor []string
	}{
		{"root only", []runtime.VolumeMount{wm("/w", "", false)}, nil, "", "", "/w", nil, nil},
		{"root and a sub_path of the same container", []runtime.VolumeMount{wm("/w", "", false), wm("/ab", "a/b", true)}, nil, "",
			containerFiller, fillerPath(0), []string{"a/b"}, []string{""}},
		{"root, a sidecar's sub_path", []runtime.VolumeMount{wm("/w", "", false)}, side(wm("/ab", "a/b", false)), "",
			containerFiller, fillerPath(0), []string{"a/b"}, []string{"side"}},
		{"a sub_path only", []runtime.VolumeMount{wm("/ab", "a/b", false)}, nil, "",
			containerFiller, fillerPath(0), []string{"a/b"}, []string{""}},
		{"read-only only", []runtime.VolumeMount{wm("/w", "", true)}, nil, "", containerFiller, fillerPath(0), nil, nil},
		{"working directory below the root mount", []runtime.VolumeMount{wm("/w", "", false)}, nil, "/w/src/x",
			containerFiller, fillerPath(0), []string{"src/x"}, []string{""}},
		{"a sidecar mounting the root writable, the primary read-only", []runtime.VolumeMount{wm("/w", "", true)}, side(wm("/rw", "", false)), "",
			"side", "/rw", nil, nil},
	} {
		spec := scratchSpec(d, "", tc.mounts...)
		spec.WorkingDir, spec.Sidecars = tc.workingDir, tc.sidecars
		if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		plan, rel, err := b.planRestores(spec)
		rel()
		if err != nil || len(plan) != 1 {
			t.Errorf("%s: plan %+v, %v", tc.name, plan, err)
			continue
		}
		r := plan[0]
		if r.container != tc.container || r.path != tc.path || !slices.Equal(r.subDirs, tc.subDirs) || !slices.Equal(r.waitFor, tc.waitFor) || r.limits.MaxBytes != 1<<20 {
			t.Errorf("%s: plan %+v, want container %q path %s sub_dirs %q after %q, at most 1 MiB", tc.name, r, tc.container, tc.path, tc.subDirs, tc.waitFor)
		}
		if got := needsFiller(spec); got != (tc.container == containerFiller) {
			t.Errorf("%s: needsFiller %v", tc.name, got)
		}
	}

	// The Pod: the filler mounts the whole volume writable; the workload keeps its
	// sub_path mounts (the kubelet's). The volume's size (the caller's) goes on no limit
	// of the filler: the Pod's disk stays the primary's, its memory the filler's own.
	spec := scratchSpec(d, "", wm("/w", "", false), wm("/ab", "a/b", true))
	spec.Volumes[0].SizeBytes = 1 << 62
	spec.Resources.DiskBytes = 1 << 30
	sc, _ := securityFor(nil, "")
	pod := b.podFor(spec, "", b.labels(spec), nil, sc)
	b.addFiller(pod, spec)
	f := containerNamed(pod, containerFiller)
	if f == nil {
		t.Fatal("no filler in the Pod of a restored scratch volume mounted by sub_path")
	}
	if m := mountAt(f, fillerPath(0)); m == nil || m.Name != "vol-0" || m.SubPath != "" || m.ReadOnly {
		t.Errorf("filler's mount %+v, want vol-0 whole and writable", m)
	}
	if m := mountAt(containerNamed(pod, containerMain), "/ab"); m == nil || m.SubPath != "a/b" || !m.ReadOnly {
		t.Errorf("workload's /ab %+v, want sub_path a/b read-only", m)
	}
	if q, has := f.Resources.Limits[corev1.ResourceEphemeralStorage]; has {
		t.Errorf("filler's ephemeral-storage limit %s: a restored scratch volume's size lifts the Pod's disk cap", q.String())
	}
	if got, ok := podEphemeralLimit(pod); !ok || got != 1<<30 {
		t.Errorf("Pod ephemeral-storage limit %d (%v), want the primary's disk alone", got, ok)
	}
	if q := f.Resources.Limits[corev1.ResourceMemory]; q.Cmp(resource.MustParse("256Mi")) != 0 {
		t.Errorf("filler's memory limit %s, want its own 256Mi", q.String())
	}

	// A memory volume through the filler is refused, sized or not (its pages would be
	// the filler's, outside the sandbox's memory), naming the volume and the way out; at
	// its root, writable, in one container, it is filled by the workload's agent.
	for _, size := range []int64{0, 1 << 20, 1 << 62} {
		mem := scratchSpec(d, runtime.MediumMemory, wm("/ab", "a/b", false))
		mem.Volumes[0].SizeBytes = size
		if _, rel, err := b.planRestores(mem); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `memory volume "w"`) || !strings.Contains(err.Error(), "at its root, writable") {
			t.Errorf("a memory volume of %d bytes through the filler: %v, want ErrInvalidSpec naming it and the way out", size, err)
		} else {
			rel()
		}
	}
	mem := scratchSpec(d, runtime.MediumMemory, wm("/w", "", false))
	if plan, rel, err := b.planRestores(mem); err != nil || len(plan) != 1 || plan[0].container != "" || needsFiller(mem) {
		t.Errorf("a memory volume at its root, writable: %+v, %v, want the primary's agent", plan, err)
	} else {
		rel()
	}

	// The bounds: a working directory below a read-only mount; 64 directories, not 65.
	ro := scratchSpec(d, "", wm("/w", "", true))
	ro.WorkingDir = "/w/x"
	if _, rel, err := b.planRestores(ro); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "working_dir") || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("a working directory below a read-only mount: %v, want ErrInvalidSpec naming working_dir", err)
	} else {
		rel()
	}
	many := scratchSpec(d, "", wm("/w", "", false))
	for i := range fsarchive.MaxExisting {
		many.VolumeMounts = append(many.VolumeMounts, wm(fmt.Sprintf("/m%d", i), fmt.Sprintf("d%d", i), true))
	}
	if plan, rel, err := b.planRestores(many); err != nil || len(plan) != 1 || len(plan[0].subDirs) != fsarchive.MaxExisting {
		t.Errorf("%d sub_dirs: %+v, %v", fsarchive.MaxExisting, plan, err)
	} else {
		rel()
	}
	many.VolumeMounts = append(many.VolumeMounts, wm("/one-more", "one-more", true))
	if _, rel, err := b.planRestores(many); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `"w"`) || !strings.Contains(err.Error(), "at most 64") {
		t.Errorf("%d sub_dirs: %v, want ErrInvalidSpec naming the volume", fsarchive.MaxExisting+1, err)
	} else {
		rel()
	}
	// A bad sub_path the agent would refuse is refused here, before the Pod.
	bad := scratchSpec(d, "", wm("/w", "", false), wm("/x", "a/../../b", false))
	if _, rel, err := b.planRestores(bad); err == nil {
		rel()
		t.Error("a sub_path leaving the volume was planned")
	}
}

// TestScratchRestoreSubPathFill: through a real gate and a real filler agent, a restored
// scratch volume mounted at its root by the primary and by sub_path a/b by a sidecar:
// the fill waits for the sidecar (the kubelet's a/b), fills a/b in place (same inode, so
// the sidecar's mount shows the snapshot's a/b) and the rest around it; an archive with a
// symlink at a/b (or on the way, at a) is refused naming the sub_path, nothing written
// through it.
func TestScratchRestoreSubPathFill(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	primary := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}}
	side := &standbyAgent{stopAgent: stopAgent{called: make(chan struct{})}, hold: make(chan struct{})}
	b, s, dir := behindGateWithFiller(t, ctx, primary, sidecarAgent{name: "side", handler: side})
	canary := t.TempDir()
	plan := func(data []byte) []restore {
		t.Helper()
		d := digestOfBytes(data)
		open := func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		if err := b.PrepareSnapshot(ctx, d, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100}, open); err != nil {
			t.Fatal(err)
		}
		spec := scratchSpec(d, "", wm("/w", "", false))
		spec.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", VolumeMounts: []runtime.VolumeMount{wm("/ab", "a/b", false)}}}
		if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		s.spec = *spec
		b.mu.Unlock()
		p, rel, err := b.planRestores(spec)
		t.Cleanup(rel)
		if err != nil || len(p) != 1 || p[0].container != containerFiller || !slices.Equal(p[0].subDirs, []string{"a/b"}) || !slices.Equal(p[0].waitFor, []string{"side"}) {
			t.Fatalf("plan %+v, %v; want the filler, sub_dirs a/b after the sidecar", p, err)
		}
		return p
	}
	kubelet := func(name string) string {
		t.Helper()
		d := filepath.Join(dir, name)
		must(t, os.MkdirAll(filepath.Join(d, "a", "b"), 0o777))
		return d
	}

	// Hostile archives first (the good fill ends the filler). The first also shows the
	// wait: nothing is extracted before the sidecar (whose a/b the kubelet makes) answers.
	for i, tc := range []struct {
		name string
		mk   func(root string)
	}{
		{"symlink at the sub_path", func(root string) {
			must(t, os.MkdirAll(filepath.Join(root, "a"), 0o755))
			must(t, os.Symlink(canary, filepath.Join(root, "a", "b")))
		}},
		{"symlink on the way", func(root string) { must(t, os.Symlink(canary, filepath.Join(root, "a"))) }},
	} {
		p := plan(archiveOf(t, tc.mk))
		p[0].path = kubelet(strings.ReplaceAll(tc.name, " ", "-"))
		done := make(chan error, 1)
		go func() { done <- b.runRestores(ctx, s, p) }()
		if i == 0 {
			for deadline := time.Now().Add(10 * time.Second); side.statuses.Load() == 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the sidecar was never asked")
				}
			}
			time.Sleep(300 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("the fill ended (%v) before the sidecar answered", err)
			default:
			}
			if fi, err := os.Lstat(filepath.Join(p[0].path, "a", "b")); err != nil || !fi.IsDir() {
				t.Fatalf("the kubelet's a/b touched before the sidecar answered: %v, %v", fi, err)
			}
			close(side.hold)
		}
		err := <-done
		if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "a/b") || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("%s: %v, want ErrInvalidSpec naming a/b and the symlink", tc.name, err)
		}
		if ents, _ := os.ReadDir(canary); len(ents) != 0 {
			t.Errorf("%s: written through the symlink: %v", tc.name, ents)
		}
	}

	good := plan(archiveOf(t, func(root string) {
		must(t, os.MkdirAll(filepath.Join(root, "a", "b", "c"), 0o750))
		must(t, os.WriteFile(filepath.Join(root, "a", "b", "f.txt"), []byte("under a/b"), 0o644))
		must(t, os.WriteFile(filepath.Join(root, "top.txt"), []byte("at the root"), 0o644))
	}))
	copyDir := kubelet("good")
	before := ino(t, filepath.Join(copyDir, "a", "b"))
	good[0].path = copyDir
	err := b.runRestores(ctx, s, good)
	// The fill is done; ending the filler (`sandbox-gate noop`, absent here) may fail.
	if err != nil && !strings.Contains(err.Error(), "end the volume filler") {
		t.Fatalf("fill: %v", err)
	}
	if after := ino(t, filepath.Join(copyDir, "a", "b")); after != before {
		t.Errorf("a/b is another directory after the fill (inode %d, was %d): the sidecar's mount would not show it", after, before)
	}
	for name, want := range map[string]string{"a/b/f.txt": "under a/b", "top.txt": "at the root"} {
		if got, err := os.ReadFile(filepath.Join(copyDir, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	ino(t, filepath.Join(copyDir, "a", "b", "c"))

}

// TestFillerLimitOverflow: the GLOBAL copies' sizes the filler's ephemeral-storage limit
// takes are summed saturating (three copies of 2^62 bytes do not wrap to a negative
// limit), and a total above maxFillerCopiesBytes is refused before anything is made
// (ErrInvalidSpec), while one at the bound is planned.
func TestFillerLimitOverflow(t *testing.T) {
	if got := addBytes(1<<62, 1<<62); got != math.MaxInt64 {
		t.Errorf("2^62 + 2^62 = %d, want saturated at MaxInt64", got)
	}
	if got := addBytes(math.MaxInt64, 1); got != math.MaxInt64 {
		t.Errorf("MaxInt64 + 1 = %d", got)
	}
	if got := addBytes(-5, 3); got != 3 {
		t.Errorf("-5 + 3 = %d, want a negative size counted as 0", got)
	}
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	d := prepareEmpty(t, b)
	spec := globalSpec(d)
	for _, n := range []string{"g2", "g3"} {
		spec.Volumes = append(spec.Volumes, runtime.Volume{Name: n, SizeBytes: 1 << 20, RestoreDigest: d,
			Global: &runtime.GlobalVolume{BlobPrefix: "volumes/x/" + n + "/", MaxSizeBytes: 1 << 20}})
		spec.VolumeMounts = append(spec.VolumeMounts, runtime.VolumeMount{Volume: n, Path: "/" + n, ReadOnly: true})
	}
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		t.Fatal(err)
	}
	set := func(size int64) {
		for i := 1; i < len(spec.Volumes); i++ {
			spec.Volumes[i].SizeBytes = size
		}
	}
	set(maxFillerCopiesBytes / 3)
	if plan, rel, err := b.planRestores(spec); err != nil || len(plan) != 3 {
		t.Errorf("copies within the bound: %+v, %v", plan, err)
	} else {
		rel()
	}
	for _, size := range []int64{maxFillerCopiesBytes/3 + 1, 1 << 62} {
		set(size)
		if _, rel, err := b.planRestores(spec); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "add up to more than") {
			t.Errorf("three copies of %d bytes: %v, want ErrInvalidSpec", size, err)
		} else {
			rel()
		}
	}
	// addFiller never wraps: with the bound skipped, the limit is saturated, not negative.
	b.cfg.DiskBytes = 1 << 30
	sc, _ := securityFor(nil, "")
	pod := b.podFor(spec, "", b.labels(spec), nil, sc)
	b.addFiller(pod, spec)
	if q := containerNamed(pod, containerFiller).Resources.Limits[corev1.ResourceEphemeralStorage]; q.Value() != math.MaxInt64 {
		t.Errorf("filler's ephemeral-storage limit for three 2^62 copies %s, want saturated", q.String())
	}
}

// TestFillDirsTmpfsMountPoints: runc makes the mount points of a container's tmpfs
// emptyDirs in the volume mounted above them: a group container's tmpfs paths, and under
// a read-only root filesystem the memory emptyDirs at /tmp, /var/tmp and /run (unless a
// volume is mounted there). Below a writable mount of a restored volume they are filled
// in place through the filler (waiting for that container); below a read-only mount of
// a GLOBAL copy they are refused, naming the field.
func TestFillDirsTmpfsMountPoints(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	d := prepareEmpty(t, b)
	plan := func(t *testing.T, spec *runtime.Spec) (restore, error) {
		t.Helper()
		if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
			t.Fatal(err)
		}
		p, rel, err := b.planRestores(spec)
		rel()
		if err != nil {
			return restore{}, err
		}
		if len(p) == 0 {
			t.Fatal("nothing planned")
		}
		return p[len(p)-1], nil
	}

	// A read-only root: /var/tmp is a tmpfs mounted below the volume's mount at /var.
	ro := scratchSpec(d, "", wm("/var", "", false))
	ro.Security = &runtime.Security{ReadOnlyRootFS: true}
	if r, err := plan(t, ro); err != nil || r.container != containerFiller || !slices.Equal(r.subDirs, []string{"tmp"}) || !slices.Equal(r.waitFor, []string{""}) {
		t.Errorf("read-only root, volume at /var: %+v, %v; want the filler, sub_dirs tmp after the primary", r, err)
	}
	// A volume mounted at /var/tmp itself takes that path: no tmpfs there, nothing made.
	ro2 := scratchSpec(d, "", wm("/var/tmp", "", false))
	ro2.Security = &runtime.Security{ReadOnlyRootFS: true}
	if r, err := plan(t, ro2); err != nil || r.container != "" || len(r.subDirs) != 0 {
		t.Errorf("read-only root, volume at /var/tmp: %+v, %v; want the primary's agent", r, err)
	}

	// A group: the sidecar's tmpfs /w/cache below its mount of the volume.
	grp := scratchSpec(d, "", wm("/w", "", false))
	grp.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", VolumeMounts: []runtime.VolumeMount{wm("/w", "", false)}, Tmpfs: []string{"/w/cache"}}}
	if r, err := plan(t, grp); err != nil || r.container != containerFiller || !slices.Equal(r.subDirs, []string{"cache"}) || !slices.Equal(r.waitFor, []string{"side"}) {
		t.Errorf("group, tmpfs below the mount: %+v, %v; want the filler, sub_dirs cache after side", r, err)
	}

	// A GLOBAL copy mounted read-only at /data with a tmpfs below it: refused.
	g := globalSpec(d)
	g.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh",
		VolumeMounts: []runtime.VolumeMount{{Volume: "g", Path: "/data", ReadOnly: true}}, Tmpfs: []string{"/data/t"}}}
	if _, err := plan(t, g); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "tmpfs") || !strings.Contains(err.Error(), "/data/t") {
		t.Errorf("GLOBAL copy, tmpfs below a read-only mount: %v, want ErrInvalidSpec naming the tmpfs", err)
	}
}
