package k8s

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// snapshotStack is setup with a blob store (a directory): a runner that takes and
// restores file-system snapshots.
func snapshotStack(t testing.TB) *stack.KubernetesStack {
	t.Helper()
	needCluster(t)
	store, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return snapshotStackWith(t, store)
}

// snapshotStackWith is snapshotStack over store.
func snapshotStackWith(t testing.TB, store blob.Store) *stack.KubernetesStack {
	t.Helper()
	c := needCluster(t)
	runnerID := randomID("test-")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := stack.NewKubernetes(ctx, stack.KubernetesConfig{
		Kubeconfig: c.kubeconfig,
		DataDir:    t.TempDir(),
		Backend: &kubernetes.Config{
			Namespace: c.namespace, RunnerID: runnerID, AgentImage: c.agentImage,
			ImagePullPolicy: corev1.PullNever, ImageConfig: localImageConfig,
			TerminationGrace: 5 * time.Second,
		},
		Blobs: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		deleteRunnerObjects(s.Client, c.namespace, runnerID)
	})
	return s
}

func waitSnapshot(t *testing.T, r *runner.Runner, id string) runner.SnapshotJob {
	t.Helper()
	end := time.Now().Add(2 * time.Minute)
	for {
		j := r.GetSnapshotJob(id)
		if j.State != runner.SnapshotCreating {
			if j.State != runner.SnapshotReady {
				t.Fatalf("snapshot %s: %+v", id, j)
			}
			return j
		}
		if time.Now().After(end) {
			t.Fatalf("snapshot %s still CREATING", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sourceOf(j runner.SnapshotJob, key string) runner.SnapshotSource {
	return runner.SnapshotSource{SnapshotID: j.SnapshotID, BlobKey: key, Digest: j.Digest, SizeBytes: j.SizeBytes, ContentBytes: j.ContentBytes}
}

// snapshotOf snapshots volume "work" of sandbox id as snapshot name (its blob key
// fss/org/<name>.tar.zst, at most 64 MiB), waits until it is READY and returns it as a
// restore's source.
func snapshotOf(t *testing.T, r *runner.Runner, id, name string) runner.SnapshotSource {
	t.Helper()
	key := "fss/org/" + name + ".tar.zst"
	if _, err := r.SnapshotVolume(context.Background(), id, runner.SnapshotTarget{Volume: "work", SnapshotID: name, BlobKey: key, MaxSizeBytes: 64 << 20}); err != nil {
		t.Fatalf("snapshot %s of %s: %v", name, id, err)
	}
	return sourceOf(waitSnapshot(t, r, name), key)
}

func volumeSpec(medium string) runtime.Spec {
	return runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"},
			VolumeMounts: []runtime.VolumeMount{{Volume: "work", Path: "/work"}}},
		Volumes: []runtime.Volume{{Name: "work", SizeBytes: 64 << 20, Medium: medium}},
	}
}

// TestVolumeSnapshot: a scratch volume (an emptyDir) written through exec is
// snapshotted through the agent while the sandbox runs, and a new sandbox restoring it
// finds the content (files, a directory, a symlink, modes) before its first command;
// a delete's snapshot is taken before the Pod goes and restores into a memory volume;
// a volume mounted read-only only is filled through the runner's filler.
func TestVolumeSnapshot(t *testing.T) {
	s := snapshotStack(t)
	r := s.Runner
	ctx := context.Background()
	if r.Support().NoSnapshots {
		t.Fatal("the kubernetes runner with a blob store reports no snapshots")
	}

	src, err := r.Create(ctx, runner.CreateRequest{Spec: volumeSpec("")})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, src.ID, 2*time.Minute, running)
	res := exec(t, r, src.ID, "sh", "-c", `set -e; mkdir -p /work/dir/sub; echo hello > /work/dir/sub/f.txt; printf 'x%.0s' $(seq 1 5000) > /work/big; chmod 0750 /work/dir; ln -s /etc/hostname /work/link; echo ok`)
	if strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("write: %q %q", res.Stdout, res.Stderr)
	}
	start := time.Now()
	key := "fss/org/snap1.tar.zst"
	job, err := r.SnapshotVolume(ctx, src.ID, runner.SnapshotTarget{Volume: "work", SnapshotID: "snap1", BlobKey: key, MaxSizeBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if job.Pause != 0 {
		t.Errorf("pause %s: nothing is frozen on Kubernetes", job.Pause)
	}
	job = waitSnapshot(t, r, "snap1")
	t.Logf("snapshot READY in %s: %d bytes archived, %d of content", time.Since(start).Round(time.Millisecond), job.SizeBytes, job.ContentBytes)
	if job.ContentBytes != 6+5000 {
		t.Errorf("content bytes %d, want %d", job.ContentBytes, 6+5000)
	}

	// Restore: the main command sees the content at once (it reads it as it starts).
	spec := volumeSpec("")
	spec.Command, spec.Args = "sh", []string{"-c", "cat /work/dir/sub/f.txt > /tmp/first; exec sleep 3600"}
	start = time.Now()
	dst, err := r.Create(ctx, runner.CreateRequest{Spec: spec, Restores: map[string]runner.SnapshotSource{"work": sourceOf(job, key)}})
	if err != nil {
		t.Fatal(err)
	}
	sb := waitState(t, r, dst.ID, 2*time.Minute, running)
	if sb.State != runner.StateRunning {
		t.Fatalf("restored sandbox: %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	t.Logf("create from snapshot -> RUNNING %s", time.Since(start).Round(time.Millisecond))
	res = exec(t, r, dst.ID, "sh", "-c", `cat /tmp/first; wc -c < /work/big; stat -c %a /work/dir; readlink /work/link`)
	if got, want := string(res.Stdout), "hello\n5000\n750\n/etc/hostname\n"; got != want {
		t.Errorf("restored volume: %q, want %q (stderr %q)", got, want, res.Stderr)
	}
	if got := r.CachedSnapshots(); len(got) != 1 || got[0] != job.Digest {
		t.Errorf("cached snapshots %v, want [%s]", got, job.Digest)
	}

	// Snapshot on delete: taken while the Pod still runs, then the sandbox goes.
	exec(t, r, dst.ID, "sh", "-c", "echo after > /work/later")
	key2 := "fss/org/snap2.tar.zst"
	_, jobs, err := r.DeleteWithSnapshots(dst.ID, time.Second, []runner.SnapshotTarget{{Volume: "work", SnapshotID: "snap2", BlobKey: key2}})
	if err != nil || len(jobs) != 1 || jobs[0].State == runner.SnapshotFailed {
		t.Fatalf("delete with snapshot: %+v %v", jobs, err)
	}
	terminal(t, r, dst.ID)
	job2 := waitSnapshot(t, r, "snap2")

	// Into a memory volume.
	mem, err := r.Create(ctx, runner.CreateRequest{Spec: volumeSpec(runtime.MediumMemory), Restores: map[string]runner.SnapshotSource{"work": sourceOf(job2, key2)}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, mem.ID, 2*time.Minute, running)
	res = exec(t, r, mem.ID, "sh", "-c", `cat /work/later /work/dir/sub/f.txt; grep -c tmpfs /proc/mounts >/dev/null && grep ' /work ' /proc/mounts | cut -d' ' -f3`)
	if got, want := string(res.Stdout), "after\nhello\ntmpfs\n"; got != want {
		t.Errorf("memory volume restored: %q, want %q (stderr %q)", got, want, res.Stderr)
	}

	// A group: the primary mounts the volume read-only, the sidecar writable; the restore
	// goes through the sidecar's agent while both are held, and the sidecar's command
	// finds the content as it starts.
	grp := volumeSpec("")
	grp.Container.Name = "app"
	grp.VolumeMounts[0].ReadOnly = true
	grp.Sidecars = []runtime.Container{{Name: "side", Image: busybox, Command: "sh", Args: []string{"-c", "cat /w/later > /tmp/first; exec sleep 3600"},
		VolumeMounts: []runtime.VolumeMount{{Volume: "work", Path: "/w"}}}}
	g, err := r.Create(ctx, runner.CreateRequest{Spec: grp, Restores: map[string]runner.SnapshotSource{"work": sourceOf(job2, key2)}})
	if err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, r, g.ID, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("restored group: %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	defer acancel()
	side, err := r.Agent(actx, g.ID, "side")
	if err != nil {
		t.Fatal(err)
	}
	sres, err := side.Exec(actx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat", "/tmp/first", "/w/dir/sub/f.txt"}}))
	if err != nil || string(sres.Msg.Stdout) != "after\nhello\n" {
		t.Errorf("sidecar's restored volume: %v %v", sres, err)
	}
	if res := exec(t, r, g.ID, "cat", "/work/later"); string(res.Stdout) != "after\n" {
		t.Errorf("primary's read-only view: %q %q", res.Stdout, res.Stderr)
	}

	// Only a read-only mount: filled through the runner's filler.
	ro := volumeSpec("")
	ro.VolumeMounts[0].ReadOnly = true
	rs, err := r.Create(ctx, runner.CreateRequest{Spec: ro, Restores: map[string]runner.SnapshotSource{"work": sourceOf(job, key)}})
	if err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, r, rs.ID, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("restored into a read-only mount: %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	res = exec(t, r, rs.ID, "sh", "-c", "cat /work/dir/sub/f.txt; touch /work/x 2>/dev/null && echo writable")
	if got, want := string(res.Stdout), "hello\n"; got != want {
		t.Errorf("read-only restored volume: %q, want %q (stderr %q)", got, want, res.Stderr)
	}
	for _, id := range []string{src.ID, mem.ID, g.ID, rs.ID} {
		if _, err := r.Delete(id, time.Second); err != nil {
			t.Error(err)
		}
	}
}

// BenchmarkVolumeSnapshot: on the Kubernetes backend, a snapshot of a volume holding
// $SANDBOXD_BENCH_MIB MiB of incompressible data (default 100): CREATING → READY through
// the agent (a dir blob store), the archive's size; then create → first exec of a
// sandbox restoring it (the first download, then cached) against one without a restore.
//
//	go test -run '^$' -bench VolumeSnapshot -benchtime 1x ./test/k8s/
func BenchmarkVolumeSnapshot(b *testing.B) {
	mib := 100
	if v, err := strconv.Atoi(os.Getenv("SANDBOXD_BENCH_MIB")); err == nil && v > 0 {
		mib = v
	}
	s := snapshotStack(b)
	r := s.Runner
	ctx := context.Background()
	for range b.N {
		spec := volumeSpec("")
		spec.Volumes[0].SizeBytes = int64(mib+64) << 20
		src, err := r.Create(ctx, runner.CreateRequest{Spec: spec})
		if err != nil {
			b.Fatal(err)
		}
		waitStateB(b, r, src.ID)
		execB(b, r, src.ID, "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /work/data", mib<<20))
		id := randomID("bench-snap-")
		key := "fss/org/" + id + ".tar.zst"
		start := time.Now()
		if _, err := r.SnapshotVolume(ctx, src.ID, runner.SnapshotTarget{Volume: "work", SnapshotID: id, BlobKey: key}); err != nil {
			b.Fatal(err)
		}
		var job runner.SnapshotJob
		for job = r.GetSnapshotJob(id); job.State == runner.SnapshotCreating; job = r.GetSnapshotJob(id) {
			time.Sleep(10 * time.Millisecond)
		}
		ready := time.Since(start)
		if job.State != runner.SnapshotReady {
			b.Fatalf("snapshot: %+v", job)
		}
		first := func(restore bool) time.Duration {
			req := runner.CreateRequest{Spec: spec}
			if restore {
				req.Restores = map[string]runner.SnapshotSource{"work": sourceOf(job, key)}
			}
			start := time.Now()
			sb, err := r.Create(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			waitStateB(b, r, sb.ID)
			execB(b, r, sb.ID, "true")
			d := time.Since(start)
			if restore {
				if out := execB(b, r, sb.ID, "sh", "-c", "wc -c < /work/data"); strings.TrimSpace(string(out.Stdout)) != strconv.Itoa(mib<<20) {
					b.Errorf("restored %q", out.Stdout)
				}
			}
			_, _ = r.Delete(sb.ID, time.Second)
			return d
		}
		plain := first(false)
		uncached := first(true)
		cached := first(true)
		_, _ = r.Delete(src.ID, time.Second)
		b.ReportMetric(ms(ready), "snapshot-ready-ms")
		b.ReportMetric(ms(plain), "create-first-exec-ms")
		b.ReportMetric(ms(uncached), "restore-first-exec-ms")
		b.ReportMetric(ms(cached), "restore-cached-first-exec-ms")
		fmt.Printf("kubernetes volume snapshot of %d MiB: READY in %.0f ms (archive %d bytes, pause %s); create -> first exec: plain %.0f ms, restoring %.0f ms (download), %.0f ms (cached)\n",
			mib, ms(ready), job.SizeBytes, job.Pause, ms(plain), ms(uncached), ms(cached))
	}
}

func waitStateB(b *testing.B, r *runner.Runner, id string) {
	b.Helper()
	end := time.Now().Add(2 * time.Minute)
	for {
		sb, err := r.Get(id)
		if err != nil {
			b.Fatal(err)
		}
		if sb.State == runner.StateRunning {
			return
		}
		if sb.State.Terminal() || time.Now().After(end) {
			b.Fatalf("sandbox %s: %s (%s: %s)", id, sb.State, sb.Reason, sb.Message)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func execB(b *testing.B, r *runner.Runner, id string, argv ...string) *agentv1.ExecResponse {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := r.Agent(ctx, id, "")
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		b.Fatal(err)
	}
	if res.Msg.ExitCode != 0 {
		b.Fatalf("exec %v: exit %d: %s", argv, res.Msg.ExitCode, res.Msg.Stderr)
	}
	return res.Msg
}

// TestVolumeSnapshotSubPath: a snapshot of a scratch volume with content under a/b
// restores into a sandbox mounting the volume at its root and by sub_path a/b: the
// kubelet makes a/b in the empty volume when it creates that container, and the fill
// (through the runner's filler, after that container is created) fills that very
// directory, so both views show the snapshot: a group (the primary at the root, the
// sidecar by sub_path, its command reading it as it starts), one container mounting
// it twice (a write at the root shows in the sub_path mount), and one mounting only the
// sub_path. A snapshot whose a/b is a symlink (to /) is refused naming it, and the
// sandbox never runs.
func TestVolumeSnapshotSubPath(t *testing.T) {
	s := snapshotStack(t)
	r := s.Runner
	ctx := context.Background()
	src, err := r.Create(ctx, runner.CreateRequest{Spec: volumeSpec("")})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, src.ID, 2*time.Minute, running)
	res := exec(t, r, src.ID, "sh", "-c", `set -e; mkdir -p /work/a/b/c; echo inner > /work/a/b/f; echo top > /work/top; chmod 0750 /work/a/b; echo ok`)
	if strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("write: %q %q", res.Stdout, res.Stderr)
	}
	key := "fss/org/subpath1.tar.zst"
	if _, err := r.SnapshotVolume(ctx, src.ID, runner.SnapshotTarget{Volume: "work", SnapshotID: "subpath1", BlobKey: key, MaxSizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	job := waitSnapshot(t, r, "subpath1")
	// The hostile one: a/b a symlink to /.
	exec(t, r, src.ID, "sh", "-c", "rm -rf /work/a/b && ln -s / /work/a/b")
	key2 := "fss/org/subpath2.tar.zst"
	if _, err := r.SnapshotVolume(ctx, src.ID, runner.SnapshotTarget{Volume: "work", SnapshotID: "subpath2", BlobKey: key2, MaxSizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	job2 := waitSnapshot(t, r, "subpath2")
	restores := map[string]runner.SnapshotSource{"work": sourceOf(job, key)}
	var ids []string
	up := func(what string, spec runtime.Spec) string {
		t.Helper()
		sb, err := r.Create(ctx, runner.CreateRequest{Spec: spec, Restores: restores})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ids = append(ids, sb.ID)
		if got := waitState(t, r, sb.ID, 2*time.Minute, running); got.State != runner.StateRunning {
			t.Fatalf("%s: %s (%s: %s)", what, got.State, got.Reason, got.Message)
		}
		return sb.ID
	}

	// A group: the primary at the root, the sidecar by sub_path a/b.
	grp := volumeSpec("")
	grp.Container.Name = "app"
	grp.Sidecars = []runtime.Container{{Name: "side", Image: busybox, Command: "sh", Args: []string{"-c", "cat /ab/f > /tmp/first; exec sleep 3600"},
		VolumeMounts: []runtime.VolumeMount{{Volume: "work", Path: "/ab", SubPath: "a/b"}}}}
	g := up("group", grp)
	if res := exec(t, r, g, "sh", "-c", "cat /work/top /work/a/b/f; stat -c %a /work/a/b"); string(res.Stdout) != "top\ninner\n750\n" {
		t.Errorf("group, the primary's root view: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	defer acancel()
	side, err := r.Agent(actx, g, "side")
	if err != nil {
		t.Fatal(err)
	}
	sres, err := side.Exec(actx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", "cat /tmp/first; ls /ab; stat -c %a /ab"}}))
	if err != nil || string(sres.Msg.Stdout) != "inner\nc\nf\n750\n" {
		t.Errorf("group, the sidecar's sub_path view: %v %v; want the snapshot's a/b (its f, c and mode 0750)", sres, err)
	}

	// One container mounting it twice: the root and a/b (read-only).
	twice := volumeSpec("")
	twice.VolumeMounts = append(twice.VolumeMounts, runtime.VolumeMount{Volume: "work", Path: "/ab", SubPath: "a/b", ReadOnly: true})
	tw := up("two mounts", twice)
	res = exec(t, r, tw, "sh", "-c", "cat /ab/f /work/top; echo later > /work/a/b/g; cat /ab/g; touch /ab/x 2>/dev/null && echo writable")
	if got, want := string(res.Stdout), "inner\ntop\nlater\n"; got != want {
		t.Errorf("two mounts: %q, want %q (stderr %q): one directory, the sub_path read-only", got, want, res.Stderr)
	}

	// Only the sub_path mounted.
	only := volumeSpec("")
	only.VolumeMounts = []runtime.VolumeMount{{Volume: "work", Path: "/ab", SubPath: "a/b"}}
	on := up("sub_path only", only)
	if res := exec(t, r, on, "sh", "-c", "cat /ab/f; ls /ab"); string(res.Stdout) != "inner\nc\nf\n" {
		t.Errorf("sub_path only: %q (stderr %q)", res.Stdout, res.Stderr)
	}

	// a/b a symlink to / in the snapshot: refused naming it, never running.
	restores = map[string]runner.SnapshotSource{"work": sourceOf(job2, key2)}
	if sb, err := r.Create(ctx, runner.CreateRequest{Spec: grp, Restores: restores}); err != nil {
		if !strings.Contains(err.Error(), "a/b") || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("symlink at the sub_path: refused for another reason: %v", err)
		}
	} else {
		end := waitState(t, r, sb.ID, 2*time.Minute, running)
		if end.State != runner.StateFailed || !strings.Contains(end.Message, "a/b") || !strings.Contains(end.Message, "symlink") {
			t.Errorf("symlink at the sub_path: %s (%s: %s), want FAILED naming a/b and the symlink", end.State, end.Reason, end.Message)
		} else {
			t.Logf("symlink at the sub_path: %s", end.Message)
		}
	}
	for _, id := range append(ids, src.ID) {
		if _, err := r.Delete(id, time.Second); err != nil {
			t.Error(err)
		}
	}
}
