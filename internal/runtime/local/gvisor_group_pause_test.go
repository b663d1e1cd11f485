package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPauseCheckpointGVisorGroup checkpoints a two-container gVisor group (one sentry)
// and resumes it, twice: both containers' counters continue from memory, each
// container's agent answers again, the shared volume and each root filesystem keep
// their files, and nothing of the sentry (cgroups, runsc state) is left while it is
// checkpointed. A restarted backend finds it checkpointed and resumes it; Stop while
// checkpointed ends every container; a fork as a single container, and an export, are refused.
func TestPauseCheckpointGVisorGroup(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	const id = "ckgrp"
	vm := []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass, Volumes: []runtime.Volume{{Name: "shared"}},
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm},
		Sidecars:  []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm}}}
	e.create(sp)
	side := func(b *Backend) int {
		t.Helper()
		out, _, _ := execIn(t, agentClientOf(b, id, "side"), "sh", "-c", "cat /tmp/cnt 2>/dev/null || echo 0")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("side's counter: %q", out)
		}
		return n
	}
	shSide := func(b *Backend, cmd string) string {
		t.Helper()
		out, errOut, c := execIn(t, agentClientOf(b, id, "side"), "sh", "-c", cmd)
		if c != 0 {
			t.Fatalf("side: %s: exit %d: %s", cmd, c, errOut)
		}
		return strings.TrimSpace(out)
	}
	sh(t, e.b, id, "echo a1 > /rootfile; echo shared > /data/f")
	shSide(e.b, "echo s1 > /rootfile")
	fs := sp.Clone()
	fs.ID = "ckgrp-f"
	if _, errs := e.b.Fork(ctx, id, []*runtime.Spec{&fs}); len(errs) != 1 || !errors.Is(errs[0], errdefs.ErrNotImplemented) || !strings.Contains(errs[0].Error(), "cgroup-parent annotation") {
		t.Errorf("fork of a gVisor group: %v, want refused (runsc's cgroup-parent annotation)", errs)
	}
	if _, err := e.b.ExportCheckpoint(ctx, id, nil); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "cgroup-parent annotation") {
		t.Errorf("export of a gVisor group: %v, want refused (runsc's cgroup-parent annotation)", err)
	}
	for cycle := 1; cycle <= 2; cycle++ {
		a1 := waitCount(t, e.b, id, 3*cycle)
		waitFor(t, func() bool { return side(e.b) >= 3*cycle })
		s1 := side(e.b)
		start := time.Now()
		pi, err := e.b.Pause(ctx, id, true)
		if err != nil {
			t.Fatalf("cycle %d: pause: %v", cycle, err)
		}
		t.Logf("cycle %d: pause %v (took %v), checkpoint %d bytes", cycle, time.Since(start), pi.Took, pi.CheckpointBytes)
		if !pi.Released || pi.CheckpointBytes <= 0 {
			t.Errorf("pause info %+v", pi)
		}
		if got := mustGlob("/sys/fs/cgroup/*/" + testCgroupParent + "/" + id); len(got) > 0 {
			t.Errorf("cgroups left while checkpointed: %v", got)
		}
		if list, err := e.b.runtimes[GVisorClass].list(ctx); err != nil || len(list) != 0 {
			t.Errorf("runsc still knows containers while checkpointed: %v, %v", list, err)
		}
		for _, name := range []string{"", "side"} {
			if _, err := e.b.DialAgent(ctx, id, name); !errors.Is(err, runtime.ErrPaused) {
				t.Errorf("dial %q while checkpointed: %v", name, err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if ex, err := e.b.Wait(wctx, id); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait while checkpointed = %+v, %v", ex, err)
		}
		cancel()
		start = time.Now()
		if _, err := e.b.Resume(ctx, id); err != nil {
			t.Fatalf("cycle %d: resume: %v", cycle, err)
		}
		t.Logf("cycle %d: resume %v", cycle, time.Since(start))
		a2, s2 := count(t, e.b, id), side(e.b)
		if a2 < a1 || a2 > a1+10 || s2 < s1 || s2 > s1+10 {
			t.Errorf("cycle %d: counters %d, %d before, %d, %d after resume: not continued", cycle, a1, s1, a2, s2)
		}
		waitCount(t, e.b, id, a2+2)
		waitFor(t, func() bool { return side(e.b) >= s2+2 })
		if out := sh(t, e.b, id, "cat /rootfile /data/f"); out != "a1\nshared" {
			t.Errorf("cycle %d: app's files = %q", cycle, out)
		}
		if out := shSide(e.b, "cat /rootfile /data/f"); out != "s1\nshared" {
			t.Errorf("cycle %d: side's files = %q", cycle, out)
		}
		if _, err := os.Stat(filepath.Join(e.b.dir(id), dirCheckpoint)); err == nil {
			t.Error("checkpoint left after resume")
		}
		sts, err := e.b.ContainerStatuses(ctx, id)
		if err != nil || len(sts) != 2 {
			t.Errorf("statuses after resume: %+v, %v", sts, err)
		}
	}

	// A restarted backend finds it checkpointed, and resumes it.
	a1 := count(t, e.b, id)
	s1 := side(e.b)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	b2 := e.backend()
	rs, err := b2.Recover(ctx)
	if err != nil || len(rs) != 1 || !rs[0].Paused || !rs[0].Released || rs[0].Alive || rs[0].Exit != nil {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if _, err := b2.DialAgent(ctx, id, "side"); !errors.Is(err, runtime.ErrPaused) {
		t.Errorf("dial side while checkpointed (restarted backend): %v", err)
	}
	if _, err := b2.Resume(ctx, id); err != nil {
		t.Fatalf("resume in a restarted backend: %v", err)
	}
	if a2, s2 := count(t, b2, id), side(b2); a2 < a1 || s2 < s1 {
		t.Errorf("counters %d, %d after resume in a restarted backend, were %d, %d", a2, s2, a1, s1)
	}
	waitFor(t, func() bool { return side(b2) >= s1+2 })

	// Stop while checkpointed: every container ends.
	if _, err := b2.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b2.Stop(sctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	ex, err := b2.Wait(sctx, id)
	if err != nil || ex.Reason != "Stopped" || ex.Message != "stopped while paused" {
		t.Errorf("wait after stop while paused = %+v, %v", ex, err)
	}
	if err := b2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}

// TestPauseCheckpointGVisorGroupEnded: a gVisor group whose init container has
// completed is checkpointed and resumed: the init container (deleted in runsc before the
// save) stays reported exited with its exit code 0, the app and the sidecar continue
// from memory; a restarted backend resumes it too; Destroy while checkpointed leaves
// nothing.
func TestPauseCheckpointGVisorGroupEnded(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	const id = "ckgrp-init"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container:      runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		InitContainers: []runtime.Container{{Name: "init", Image: "busybox", Command: "true"}},
		Sidecars:       []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}}
	e.create(sp)
	side := func(b *Backend) int {
		t.Helper()
		out, _, _ := execIn(t, agentClientOf(b, id, "side"), "sh", "-c", "cat /tmp/cnt 2>/dev/null || echo 0")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	checkStatuses := func(b *Backend, when string) {
		t.Helper()
		sts, err := b.ContainerStatuses(ctx, id)
		if err != nil {
			t.Fatalf("%s: statuses: %v", when, err)
		}
		got := map[string]string{}
		for _, st := range sts {
			got[st.Name] = st.State
			if st.Name == "init" && (st.ExitCode == nil || *st.ExitCode != 0) {
				t.Errorf("%s: init's exit code %v, want 0", when, st.ExitCode)
			}
		}
		if got["init"] != runtime.ContainerExited || got["app"] != runtime.ContainerRunning || got["side"] != runtime.ContainerRunning {
			t.Errorf("%s: statuses %v", when, got)
		}
	}
	waitCount(t, e.b, id, 2)
	waitFor(t, func() bool { return side(e.b) >= 2 })
	checkStatuses(e.b, "before")
	a1, s1 := count(t, e.b, id), side(e.b)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("checkpoint of a group with a completed init container: %v", err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if a2, s2 := count(t, e.b, id), side(e.b); a2 < a1 || a2 > a1+10 || s2 < s1 || s2 > s1+10 {
		t.Errorf("counters %d, %d before, %d, %d after resume: not continued", a1, s1, a2, s2)
	}
	checkStatuses(e.b, "after resume")
	a1 = waitCount(t, e.b, id, a1+2)

	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	b2 := e.backend()
	if rs, err := b2.Recover(ctx); err != nil || len(rs) != 1 || !rs[0].Paused || !rs[0].Released {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if _, err := b2.Resume(ctx, id); err != nil {
		t.Fatalf("resume in a restarted backend: %v", err)
	}
	if a2 := count(t, b2, id); a2 < a1 {
		t.Errorf("counter %d after resume in a restarted backend, was %d", a2, a1)
	}
	waitFor(t, func() bool { return side(b2) >= s1+4 })
	checkStatuses(b2, "after resume in a restarted backend")
	// Destroy while checkpointed: every container's Wait returns, nothing is left.
	if _, err := b2.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if err := b2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}

// BenchmarkPauseResumeGVisorGroup: a checkpoint pause and a resume of an idle
// two-container gVisor group on the bridge (p50/p99 of each, the checkpoint's size).
func BenchmarkPauseResumeGVisorGroup(b *testing.B) {
	e := gvisorEnv(b)
	e.withNetwork(b, 13)
	ctx := context.Background()
	const id = "bprg"
	e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sleep", Args: []string{"100000"}},
		Sidecars:  []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"100000"}}}})
	var pauses, resumes []time.Duration
	var size int64
	b.ResetTimer()
	for range b.N {
		pi, err := e.b.Pause(ctx, id, true)
		if err != nil {
			b.Fatal(err)
		}
		pauses = append(pauses, pi.Took)
		size = pi.CheckpointBytes
		start := time.Now()
		if _, err := e.b.Resume(ctx, id); err != nil {
			b.Fatal(err)
		}
		resumes = append(resumes, time.Since(start))
	}
	b.StopTimer()
	percentiles(b, pauses, "pause-")
	percentiles(b, resumes, "resume-")
	b.ReportMetric(float64(size), "checkpoint-bytes")
}
