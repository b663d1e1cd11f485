package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPauseCheckpointGVisorGroup checkpoints a two-container gVisor group (one sentry)
// and resumes it, twice: both containers' counters continue from memory, each
// container's agent answers again, the shared volume and each root filesystem keep
// their files, and nothing of the sentry (cgroups, runsc state) is left while it is
// checkpointed. A restarted backend finds it checkpointed and resumes it; Stop while
// checkpointed ends every container.
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
// from memory; it is forked while running and while checkpointed (also by a restarted
// backend): each fork runs, its init container recorded as completed with the source's
// exit (code, reason, finish time: never run again) and log, its app and sidecar
// continuing from the source's memory; Destroy while checkpointed leaves nothing.
func TestPauseCheckpointGVisorGroupEnded(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	const id = "ckgrp-init"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container:      runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		InitContainers: []runtime.Container{{Name: "init", Image: "busybox", Command: "sh", Args: []string{"-c", "echo init-done"}}},
		Sidecars:       []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}}
	e.create(sp)
	side := func(b *Backend, id string) int {
		t.Helper()
		out, _, _ := execIn(t, agentClientOf(b, id, "side"), "sh", "-c", "cat /tmp/cnt 2>/dev/null || echo 0")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	waitCount(t, e.b, id, 2)
	waitFor(t, func() bool { return side(e.b, id) >= 2 })
	checkInitGroup(t, e.b, id, "before")
	var srcInit runtime.Exit
	if err := readJSON(filepath.Join(memberDir(e.b.dir(id), "init"), fileExit), &srcInit); err != nil {
		t.Fatal(err)
	}
	// fork forks id (its counters at least a1, s1) on b; the fork's counters continue
	// from the source's memory: from a1, s1 on, and (a source running on) at most the
	// source's when read after them, (a checkpointed source) at most what the time
	// since a1, s1 were read allows.
	fork := func(b *Backend, fid, when string, a1, s1 int) {
		t.Helper()
		since := time.Now()
		f := sp.Clone()
		f.ID = fid
		start := time.Now()
		if _, errs := b.Fork(ctx, id, []*runtime.Spec{&f}); errs[0] != nil {
			t.Fatalf("%s: fork of a group whose init container completed: %v", when, errs[0])
		}
		t.Logf("%s: fork of a group with a completed init container: %v", when, time.Since(start))
		checkInitGroup(t, b, fid, when+": fork")
		var ex runtime.Exit
		if err := readJSON(filepath.Join(memberDir(b.dir(fid), "init"), fileExit), &ex); err != nil || !ex.At.Equal(srcInit.At) || ex.Reason != srcInit.Reason {
			t.Errorf("%s: fork's init exit %+v (%v), the source's %+v: not recorded as it was", when, ex, err, srcInit)
		}
		if out, _ := os.ReadFile(filepath.Join(b.LogDir(fid, "init"), "main.log")); strings.Count(string(out), "init-done") != 1 {
			t.Errorf("%s: fork's init log %q, want the source's (one run)", when, out)
		}
		fa, fs := count(t, b, fid), side(b, fid)
		most := int(time.Since(since)/(100*time.Millisecond)) + 20
		ma, ms := a1+most, s1+most
		if !b.isPaused(id) {
			ma, ms = count(t, b, id)+10, side(b, id)+10
		}
		if fa < a1 || fa > ma || fs < s1 || fs > ms {
			t.Errorf("%s: fork's counters %d, %d; want from %d, %d to %d, %d: not continued", when, fa, fs, a1, s1, ma, ms)
		}
		waitCount(t, b, fid, fa+2)
		waitFor(t, func() bool { return side(b, fid) >= fs+2 })
		if err := b.Destroy(ctx, fid); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, e.state, fid)
	}
	fork(e.b, "ckgrp-init-f", "running", count(t, e.b, id), side(e.b, id))
	checkInitGroup(t, e.b, id, "after the fork")

	a1, s1 := count(t, e.b, id), side(e.b, id)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("checkpoint of a group with a completed init container: %v", err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if a2, s2 := count(t, e.b, id), side(e.b, id); a2 < a1 || a2 > a1+10 || s2 < s1 || s2 > s1+10 {
		t.Errorf("counters %d, %d before, %d, %d after resume: not continued", a1, s1, a2, s2)
	}
	checkInitGroup(t, e.b, id, "after resume")
	a1 = waitCount(t, e.b, id, a1+2)
	s1 = side(e.b, id)

	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	b2 := e.backend()
	if rs, err := b2.Recover(ctx); err != nil || len(rs) != 1 || !rs[0].Paused || !rs[0].Released {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	fork(b2, "ckgrp-init-g", "checkpointed, restarted backend", a1, s1)
	if _, err := b2.Resume(ctx, id); err != nil {
		t.Fatalf("resume in a restarted backend: %v", err)
	}
	if a2 := count(t, b2, id); a2 < a1 {
		t.Errorf("counter %d after resume in a restarted backend, was %d", a2, a1)
	}
	waitFor(t, func() bool { return side(b2, id) >= s1+4 })
	checkInitGroup(t, b2, id, "after resume in a restarted backend")
	// Destroy while checkpointed: every container's Wait returns, nothing is left.
	if _, err := b2.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if err := b2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}

// checkInitGroup checks the container statuses of group id (init, app, side): the init
// container exited with code 0, the others running.
func checkInitGroup(t *testing.T, b *Backend, id, when string) {
	t.Helper()
	sts, err := b.ContainerStatuses(context.Background(), id)
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

// TestPauseExportGVisorGroupInit: a gVisor group whose init container has completed
// moves and forks to another backend (another state dir: another runner) through an
// export: a cross-runner fork of it running, then a move of it checkpointed. Each made
// group runs with its init container recorded as completed (the source's exit and log,
// never run again) and its app and sidecar continuing from memory; the moved group
// pauses and resumes there in a restarted backend. A tampered group.json in the store
// (the init container's recorded exit) is refused, leaving nothing.
func TestPauseExportGVisorGroupInit(t *testing.T) {
	e := exportEnv(t)
	e2 := exportEnv(t) // the other runner
	ctx := context.Background()
	store := newCkStore(t)
	const id = "gxi-1"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container:      runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		InitContainers: []runtime.Container{{Name: "init", Image: "busybox", Command: "sh", Args: []string{"-c", "echo init-done"}}},
		Sidecars:       []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}}
	e.create(sp)
	waitCount(t, e.b, id, 2)
	waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= 2 })
	var srcInit runtime.Exit
	if err := readJSON(filepath.Join(memberDir(e.b.dir(id), "init"), fileExit), &srcInit); err != nil {
		t.Fatal(err)
	}
	pinned := func(fid string) *runtime.Spec {
		f := sp.Clone()
		f.ID = fid
		f.Image = "busybox@sha256:b0b0"
		return &f
	}
	// check checks group fid on b made from id's export (its counters at least a1, s1
	// then, read at since; upper, when not nil, reads the source's counters now).
	check := func(b *Backend, fid, when string, a1, s1 int, since time.Time, upper func() (int, int)) {
		t.Helper()
		checkInitGroup(t, b, fid, when)
		var ex runtime.Exit
		if err := readJSON(filepath.Join(memberDir(b.dir(fid), "init"), fileExit), &ex); err != nil || !ex.At.Equal(srcInit.At) || ex.Reason != srcInit.Reason || ex.ExitCode == nil || *ex.ExitCode != 0 {
			t.Errorf("%s: init exit %+v (%v), the source's %+v: not recorded as it was", when, ex, err, srcInit)
		}
		if out, _ := os.ReadFile(filepath.Join(b.LogDir(fid, "init"), "main.log")); strings.Count(string(out), "init-done") != 1 {
			t.Errorf("%s: init log %q, want the source's (one run)", when, out)
		}
		fa, fs := count(t, b, fid), groupCounter(t, b, fid, "side")
		most := int(time.Since(since)/(100*time.Millisecond)) + 20
		ma, ms := a1+most, s1+most
		if upper != nil {
			ma, ms = upper()
			ma, ms = ma+10, ms+10
		}
		if fa < a1 || fa > ma || fs < s1 || fs > ms {
			t.Errorf("%s: counters %d, %d; want from %d, %d to %d, %d: not continued", when, fa, fs, a1, s1, ma, ms)
		}
		waitCount(t, b, fid, fa+2)
		waitFor(t, func() bool { return groupCounter(t, b, fid, "side") >= fs+2 })
	}

	// A cross-runner fork of the running group.
	a1, s1 := count(t, e.b, id), groupCounter(t, e.b, id, "side")
	since := time.Now()
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("gxf"))
	if err != nil {
		t.Fatalf("export of a running group with a completed init container: %v", err)
	}
	if want := []string{"image", "run", "group", "init-0", "member-0"}; !slices.Equal(ex.Parts, want) {
		t.Errorf("parts %v, want %v", ex.Parts, want)
	}
	const fid = "gxi-fork"
	start := time.Now()
	if _, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gxf"), []*runtime.Spec{pinned(fid)}); errs[0] != nil {
		t.Fatalf("fork on another backend: %v", errs[0])
	}
	t.Logf("cross-runner fork of a group with a completed init container (import, restore): %v", time.Since(start))
	checkNoImportLeft(t, e2)
	check(e2.b, fid, "cross-runner fork", a1, s1, since, func() (int, int) { return count(t, e.b, id), groupCounter(t, e.b, id, "side") })
	checkInitGroup(t, e.b, id, "the source after the export")

	// A move of the checkpointed group.
	sb, err := e.b.get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sideDigest := sb.container("side").info.ImageDigest
	a1, s1 = count(t, e.b, id), groupCounter(t, e.b, id, "side")
	since = time.Now()
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	ex, err = e.b.ExportCheckpoint(ctx, id, store.put("gxm"))
	if err != nil {
		t.Fatalf("export of a checkpointed group with a completed init container: %v", err)
	}
	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	start = time.Now()
	infos, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gxm"), []*runtime.Spec{pinned(id)})
	if errs[0] != nil {
		t.Fatalf("move to another backend: %v", errs[0])
	}
	t.Logf("move of a group with a completed init container (import, restore): %v", time.Since(start))
	if infos[0].ID != id {
		t.Errorf("moved group's info %+v", infos[0])
	}
	checkNoImportLeft(t, e2)
	check(e2.b, id, "moved", a1, s1, since, nil)
	// group.json is the importing runner's untrusted input: a tampered record of the init
	// container's exit (put in the store in place of the export's) is refused before
	// any sandbox is made, leaving nothing.
	members := `"members":[{"name":"side","digest":"` + sideDigest + `"}]`
	for what, completed := range map[string]string{
		"exit code 1":      `{"name":"init","exitCode":1,"restarts":0,"reason":"Error","message":"","finishedAt":"2026-12-04T22:00:00Z"}`,
		"escape in reason": `{"name":"init","exitCode":0,"restarts":0,"reason":"Completed\u001b]0;x\u0007","message":"","finishedAt":"2026-12-04T22:00:00Z"}`,
		"other container":  `{"name":"side","exitCode":0,"restarts":0,"reason":"Completed","message":"","finishedAt":"2026-12-04T22:00:00Z"}`,
		"no record":        ``,
	} {
		var buf bytes.Buffer
		if err := fsarchive.WriteFiles(&buf, map[string][]byte{fileGroupExport: []byte(`{` + members + `,"completed":[` + completed + `]}`)}); err != nil {
			t.Fatal(err)
		}
		if err := store.put("gxm")(ctx, partGroup, &buf); err != nil {
			t.Fatal(err)
		}
		if _, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gxm"), []*runtime.Spec{pinned("gxi-t")}); !errors.Is(errs[0], runtime.ErrInvalidSpec) {
			t.Errorf("tampered group.json (%s): %v, want refused", what, errs[0])
		} else {
			t.Logf("tampered group.json (%s): %v", what, errs[0])
		}
		checkNoLeaks(t, e2.state, "gxi-t")
		checkNoImportLeft(t, e2)
	}
	// The moved group pauses and resumes there, also in a restarted backend, which
	// finds the running fork as it was too.
	if _, err := e2.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("pause of the moved group: %v", err)
	}
	b3 := e2.backend()
	if rs, err := b3.Recover(ctx); err != nil || len(rs) != 2 {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if _, err := b3.Resume(ctx, id); err != nil {
		t.Fatalf("resume of the moved group in a restarted backend: %v", err)
	}
	checkInitGroup(t, b3, id, "moved, resumed in a restarted backend")
	checkInitGroup(t, b3, fid, "cross-runner fork, in a restarted backend")
	// A fork of the moved group (its init container recorded, not run, on this runner).
	const ffid = "gxi-ff"
	if _, errs := b3.Fork(ctx, id, []*runtime.Spec{pinned(ffid)}); errs[0] != nil {
		t.Fatalf("fork of the moved group: %v", errs[0])
	}
	check(b3, ffid, "fork of the moved group", 2, 2, time.Now(), func() (int, int) { return count(t, b3, id), groupCounter(t, b3, id, "side") })
	for _, x := range []string{ffid, fid, id} {
		if err := b3.Destroy(ctx, x); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, e2.state, x)
	}

	// A group whose sidecar has ended: TestGVisorGroupEndedSidecar.
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

// groupCounter reads the counter (counterLoop) of container name of sandbox id.
func groupCounter(t testing.TB, b *Backend, id, name string) int {
	t.Helper()
	out, _, _ := execIn(t, agentClientOf(b, id, name), "sh", "-c", "cat /tmp/cnt 2>/dev/null || echo 0")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s/%s: counter %q", id, name, out)
	}
	return n
}

// shIn runs cmd in container name of sandbox id and returns its output (trimmed).
func shIn(t testing.TB, b *Backend, id, name, cmd string) string {
	t.Helper()
	out, errOut, c := execIn(t, agentClientOf(b, id, name), "sh", "-c", cmd)
	if c != 0 {
		t.Fatalf("%s/%s: %s: exit %d: %s", id, name, cmd, c, errOut)
	}
	return strings.TrimSpace(out)
}

// cgroupProcs is the pids in cgroup rel (below the test's parent) of controller ctl.
func cgroupProcs(ctl, rel string) string {
	raw, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, testCgroupParent, rel, "cgroup.procs"))
	return " " + strings.Join(strings.Fields(string(raw)), " ") + " "
}

// TestForkGVisorGroup forks a running two-container gVisor group (one sentry, a shared
// disk volume) twice, then the group checkpointed: every fork's app and sidecar continue
// their counters from the source's memory on their own, each fork has its own address
// and hostname, the source's root filesystems and volume files, and its writes are its
// own; each fork's sentry runs in the fork's own cgroup under the fork's limits, the
// source's sentry in its own; the source runs on, and killing a fork leaves it intact. A
// fork whose spec is not the source's is refused. Destroy leaves nothing.
func TestForkGVisorGroup(t *testing.T) {
	e := volPoolEnv(t)
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	nm := e.withNetwork(t, 15)
	ctx := context.Background()
	const src = "gfk-src"
	netGone := func(id string) {
		t.Helper()
		if a, err := nm.Lookup(id); err == nil {
			t.Errorf("%s: network namespace left after destroy: %+v", id, a)
		}
		if ids, err := nm.List(); err != nil || slices.Contains(ids, id) {
			t.Errorf("%s: network state left after destroy: %v, %v", id, ids, err)
		}
	}
	vm := []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	sp := runtime.Spec{ID: src, RuntimeClass: GVisorClass, Volumes: []runtime.Volume{{Name: "shared", SizeBytes: 64 << 20}},
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm,
			Resources: runtime.Resources{MemoryBytes: 256 << 20}},
		Sidecars: []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}, VolumeMounts: vm,
			Resources: runtime.Resources{MemoryBytes: 128 << 20}}}}
	srcInfo := e.create(sp)
	shIn(t, e.b, src, "app", "echo a > /rootfile; echo v > /data/f")
	shIn(t, e.b, src, "side", "echo s > /rootfile")
	waitCount(t, e.b, src, 5)
	waitFor(t, func() bool { return groupCounter(t, e.b, src, "side") >= 5 })

	// A fork whose containers are not the source's is refused before anything is made.
	bad := sp.Clone()
	bad.ID = "gfk-bad"
	bad.Sidecars[0].Args = []string{"-c", "sleep 1000"}
	if _, errs := e.b.Fork(ctx, src, []*runtime.Spec{&bad}); !errors.Is(errs[0], runtime.ErrInvalidSpec) || !strings.Contains(errs[0].Error(), `container "side"`) {
		t.Errorf("fork with another sidecar command: %v, want refused", errs[0])
	}
	if _, err := os.Stat(e.b.dir(bad.ID)); !os.IsNotExist(err) {
		t.Errorf("a refused fork left its dir: %v", err)
	}

	// A fork that fails half way (its sidecar, after the sentry's restore: an image at
	// another digest than the checkpoint's) is undone; the source runs on.
	srcS, err := e.b.get(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	digest := srcS.members[0].info.ImageDigest
	srcS.members[0].info.ImageDigest = "sha256:0ther"
	half := sp.Clone()
	half.ID = "gfk-half"
	if _, errs := e.b.Fork(ctx, src, []*runtime.Spec{&half}); errs[0] == nil || !strings.Contains(errs[0].Error(), "not at sha256:0ther") {
		t.Errorf("fork whose sidecar's image is at another digest: %v", errs[0])
	}
	srcS.members[0].info.ImageDigest = digest
	checkNoLeaks(t, e.state, half.ID)
	netGone(half.ID)
	if list, err := e.b.runtimes[GVisorClass].list(ctx); err != nil {
		t.Error(err)
	} else {
		for cid := range list {
			if strings.HasPrefix(cid, half.ID) {
				t.Errorf("runsc still knows %s of the undone fork", cid)
			}
		}
	}

	a0, s0 := count(t, e.b, src), groupCounter(t, e.b, src, "side")
	specs := make([]*runtime.Spec, 2)
	for i := range specs {
		f := sp.Clone()
		f.ID = "gfk-" + strconv.Itoa(i)
		f.Sidecars[0].Resources.MemoryBytes = 192 << 20 // the forks' group total: 448 MiB, the source's 384
		specs[i] = &f
	}
	memLimit := func(id string) string {
		lim, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", testCgroupParent, id, "memory.limit_in_bytes"))
		return strings.TrimSpace(string(lim))
	}
	start := time.Now()
	infos, errs := e.b.Fork(ctx, src, specs)
	t.Logf("fork x2 of a running two-container group: %v", time.Since(start))
	ips := map[string]bool{srcInfo.IP: true}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		if ips[infos[i].IP] || infos[i].IP == "" {
			t.Errorf("fork %d: IP %q not distinct", i, infos[i].IP)
		}
		ips[infos[i].IP] = true
	}
	sentry := func(id string) int {
		t.Helper()
		s, err := e.b.get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return s.info.Pid
	}
	srcPid := sentry(src)
	for i, f := range specs {
		id := f.ID
		if a, sd := count(t, e.b, id), groupCounter(t, e.b, id, "side"); a < a0 || sd < s0 {
			t.Errorf("fork %s: counters app %d side %d, the source had %d %d before the fork", id, a, sd, a0, s0)
		}
		for _, c := range []string{"app", "side"} {
			if out := shIn(t, e.b, id, c, "hostname; cat /data/f; ip -4 addr"); !strings.HasPrefix(out, id+"\nv\n") || !strings.Contains(out, infos[i].IP+"/") {
				t.Errorf("fork %s/%s: hostname, volume, addresses = %q (want %s, v, %s)", id, c, out, id, infos[i].IP)
			}
		}
		if out := shIn(t, e.b, id, "app", "cat /rootfile"); out != "a" {
			t.Errorf("fork %s: app's root file %q", id, out)
		}
		if out := shIn(t, e.b, id, "side", "cat /rootfile"); out != "s" {
			t.Errorf("fork %s: side's root file %q", id, out)
		}
		shIn(t, e.b, id, "app", "echo "+id+" > /rootfile; echo "+id+" > /data/f")
		// The fork's sentry is in the fork's own cgroup, with the fork's group total.
		pid := sentry(id)
		if pid == srcPid || !strings.Contains(cgroupProcs("memory", id), " "+strconv.Itoa(pid)+" ") {
			t.Errorf("fork %s: sentry %d not in its own memory cgroup (procs %q; the source's sentry is %d)", id, pid, cgroupProcs("memory", id), srcPid)
		}
		if got := memLimit(id); got != strconv.Itoa(448<<20) {
			t.Errorf("fork %s: memory limit %q, want the fork's group total %d", id, got, 448<<20)
		}
		for _, ctl := range []string{"cpu", "pids"} {
			if !strings.Contains(cgroupProcs(ctl, id), " "+strconv.Itoa(pid)+" ") {
				t.Errorf("fork %s: sentry %d not in its own %s cgroup (procs %q)", id, pid, ctl, cgroupProcs(ctl, id))
			}
		}
		if strings.Contains(cgroupProcs("memory", src), " "+strconv.Itoa(pid)+" ") {
			t.Errorf("fork %s: sentry %d in the source's cgroup", id, pid)
		}
	}
	if !strings.Contains(cgroupProcs("memory", src), " "+strconv.Itoa(srcPid)+" ") || memLimit(src) != strconv.Itoa(384<<20) {
		t.Errorf("the source's cgroup changed: procs %q (its sentry is %d), memory limit %q (want %d)", cgroupProcs("memory", src), srcPid, memLimit(src), 384<<20)
	}
	// Each container of each fork, and the source, count on their own.
	for _, id := range []string{src, specs[0].ID, specs[1].ID} {
		a, sd := count(t, e.b, id), groupCounter(t, e.b, id, "side")
		waitCount(t, e.b, id, a+3)
		waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= sd+3 })
	}
	if out := shIn(t, e.b, src, "side", "cat /data/f"); out != "v" {
		t.Errorf("the source's volume after the forks wrote: %q", out)
	}
	for _, f := range specs {
		if out := shIn(t, e.b, f.ID, "side", "cat /data/f"); out != f.ID {
			t.Errorf("fork %s: side sees %q in the shared volume, want the fork's app's write", f.ID, out)
		}
	}
	sts, err := e.b.ContainerStatuses(ctx, specs[0].ID)
	if err != nil || len(sts) != 2 || sts[0].State != runtime.ContainerRunning || sts[1].State != runtime.ContainerRunning {
		t.Errorf("fork's statuses: %+v, %v", sts, err)
	}

	// Killing a fork leaves the source (and the other fork) as they were.
	if err := e.b.Destroy(ctx, specs[0].ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, specs[0].ID)
	netGone(specs[0].ID)
	for _, id := range []string{src, specs[1].ID} {
		a, sd := count(t, e.b, id), groupCounter(t, e.b, id, "side")
		waitCount(t, e.b, id, a+2)
		waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= sd+2 })
	}

	// So does a fork's sentry killed (SIGKILL): the fork ends, the source runs on.
	if err := unix.Kill(sentry(specs[1].ID), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if ex, err := e.b.Wait(wctx, specs[1].ID); err != nil {
		t.Errorf("wait for the killed fork: %+v, %v", ex, err)
	}
	cancel()
	a1 := count(t, e.b, src)
	waitCount(t, e.b, src, a1+2)
	if out := shIn(t, e.b, src, "side", "cat /rootfile /data/f"); out != "s\nv" {
		t.Errorf("source's side after a fork was killed: files %q", out)
	}

	// A checkpointed group is forked from its checkpoint and stays paused.
	if _, err := e.b.Pause(ctx, src, true); err != nil {
		t.Fatal(err)
	}
	fp := sp.Clone()
	fp.ID = "gfk-p"
	start = time.Now()
	if _, errs := e.b.Fork(ctx, src, []*runtime.Spec{&fp}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	t.Logf("fork x1 of a checkpointed two-container group: %v", time.Since(start))
	waitFor(t, func() bool { return groupCounter(t, e.b, fp.ID, "side") >= s0+2 })
	if out := shIn(t, e.b, fp.ID, "side", "cat /rootfile /data/f"); out != "s\nv" {
		t.Errorf("fork of the paused group: side's files %q", out)
	}
	if !e.b.isPaused(src) {
		t.Error("the paused source is no longer paused after a fork")
	}
	if _, err := e.b.Resume(ctx, src); err != nil {
		t.Fatal(err)
	}
	a := count(t, e.b, src)
	waitCount(t, e.b, src, a+2)
	for _, id := range []string{specs[1].ID, fp.ID, src} {
		if err := e.b.Destroy(ctx, id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
		checkNoLeaks(t, e.state, id)
		netGone(id)
	}
}

// BenchmarkForkGVisorGroup: fork ×1 of a running idle two-container gVisor group on the
// bridge with a shared scratch volume, and of a single-container sandbox alike in the
// same run for reference (wall time of the Fork call; the forks are destroyed untimed).
func BenchmarkForkGVisorGroup(b *testing.B) {
	for _, group := range []bool{true, false} {
		name := "single"
		if group {
			name = "group"
		}
		b.Run(name, func(b *testing.B) {
			e := volPoolEnv(b)
			if e.b.runtimes[GVisorClass] == nil {
				b.Skip("runsc not found")
			}
			e.withNetwork(b, 16)
			ctx := context.Background()
			const src = "bgfs"
			vm := []runtime.VolumeMount{{Volume: "data", Path: "/data"}}
			sp := runtime.Spec{ID: src, RuntimeClass: GVisorClass, Volumes: []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}},
				Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"100000"}, VolumeMounts: vm}}
			if group {
				sp.Container.Name = "app"
				sp.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"100000"}, VolumeMounts: vm}}
			}
			e.create(sp)
			var walls []time.Duration
			steps := traceSteps(e.b)
			b.ResetTimer()
			for it := range b.N {
				f := sp.Clone()
				f.ID = "bgf-" + strconv.Itoa(it)
				start := time.Now()
				_, errs := e.b.Fork(ctx, src, []*runtime.Spec{&f})
				walls = append(walls, time.Since(start))
				b.StopTimer()
				if errs[0] != nil {
					b.Fatal(errs[0])
				}
				if err := e.b.Destroy(ctx, f.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			percentiles(b, walls, "fork-")
			steps.log(b, b.N, "fork")
			if err := e.b.Destroy(ctx, src); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestGroupForkMismatch: a fork of a group is restored without runsc's spec validation
// (gvisor_group_pause.go), so its spec must be the source's in all that the containers'
// OCI specs are made of; what runsc lets change (id, environment, resources, metadata)
// may.
func TestGroupForkMismatch(t *testing.T) {
	vm := []runtime.VolumeMount{{Volume: "v", Path: "/data"}}
	src := runtime.Spec{ID: "src", Volumes: []runtime.Volume{{Name: "v"}},
		Container:      runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", "x"}, VolumeMounts: vm},
		InitContainers: []runtime.Container{{Name: "init", Image: "busybox", Command: "true"}},
		Sidecars:       []runtime.Container{{Name: "side", Image: "alpine", Command: "sleep", Args: []string{"9"}}}}
	same := src.Clone()
	same.ID = "fork"
	same.Env = map[string]string{"A": "b"}
	same.Sidecars[0].Resources.MemoryBytes = 1 << 30
	same.Meta = map[string]string{"k": "v"}
	if why := groupForkMismatch(&src, &same); why != "" {
		t.Errorf("a fork differing only where runsc allows: %s", why)
	}
	for name, mod := range map[string]func(*runtime.Spec){
		"no sidecar":         func(s *runtime.Spec) { s.Sidecars = nil },
		"renamed":            func(s *runtime.Spec) { s.Sidecars[0].Name = "other" },
		"init as sidecar":    func(s *runtime.Spec) { s.Sidecars = append(s.InitContainers, s.Sidecars...); s.InitContainers = nil },
		"image":              func(s *runtime.Spec) { s.Sidecars[0].Image = "busybox" },
		"args":               func(s *runtime.Spec) { s.Container.Args = []string{"-c", "y"} },
		"working dir":        func(s *runtime.Spec) { s.InitContainers[0].WorkingDir = "/tmp" },
		"security":           func(s *runtime.Spec) { s.Sidecars[0].Security = &runtime.Security{} },
		"volume mounts":      func(s *runtime.Spec) { s.Container.VolumeMounts = nil },
		"tmpfs":              func(s *runtime.Spec) { s.Sidecars[0].Tmpfs = []string{"/tmp"} },
		"volumes":            func(s *runtime.Spec) { s.Volumes[0].SizeBytes = 1 << 20 },
		"host aliases":       func(s *runtime.Spec) { s.HostAliases = []string{"db"} },
		"single container":   func(s *runtime.Spec) { s.InitContainers, s.Sidecars = nil, nil },
		"swapped containers": func(s *runtime.Spec) { s.Container, s.Sidecars[0] = s.Sidecars[0], s.Container },
	} {
		f := src.Clone()
		mod(&f)
		if why := groupForkMismatch(&src, &f); why == "" {
			t.Errorf("%s: accepted", name)
		}
	}
}
