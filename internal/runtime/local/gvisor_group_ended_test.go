package local

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// endedGroupSpec is a gVisor group whose sidecars "done" (completes) and "flaky" (fails
// with exit code 7 after its one restart) end for good soon after the start, while the
// app and sidecar "side" count in memory.
func endedGroupSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		Sidecars: []runtime.Container{
			{Name: "done", Image: "busybox", Command: "sh", Args: []string{"-c", "echo done-ran"}},
			{Name: "flaky", Image: "busybox", Command: "sh", Args: []string{"-c", "echo flaky-ran; exit 7"}, RestartLimit: 1},
			{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		}}
}

// endedSource is what the source group recorded of its ended sidecars.
type endedSource struct {
	exits map[string]runtime.Exit
	logs  map[string]string
}

var endedNames = []string{"done", "flaky"}

// waitEnded waits until the ended sidecars of group id have their exits recorded and
// returns them with their logs.
func waitEnded(t *testing.T, b *Backend, id string) endedSource {
	t.Helper()
	ctx := context.Background()
	waitFor(t, func() bool {
		sb, err := b.get(ctx, id)
		if err != nil {
			return false
		}
		for _, n := range endedNames {
			if m := sb.container(n); m == nil || !memberEnded(m) {
				return false
			}
		}
		return true
	})
	src := endedSource{exits: map[string]runtime.Exit{}, logs: map[string]string{}}
	for _, n := range endedNames {
		var ex runtime.Exit
		if err := readJSON(filepath.Join(memberDir(b.dir(id), n), fileExit), &ex); err != nil {
			t.Fatal(err)
		}
		src.exits[n] = ex
		src.logs[n] = containerLog(t, b, id, n)
	}
	if ex := src.exits["done"]; ex.ExitCode == nil || *ex.ExitCode != 0 || ex.Reason != "Completed" || src.logs["done"] != "done-ran\n" {
		t.Fatalf("source's done: %+v, log %q", ex, src.logs["done"])
	}
	if ex := src.exits["flaky"]; ex.ExitCode == nil || *ex.ExitCode != 7 || ex.Reason != "RestartLimit" || ex.Restarts != 1 || src.logs["flaky"] != "flaky-ran\nflaky-ran\n" {
		t.Fatalf("source's flaky: %+v, log %q", ex, src.logs["flaky"])
	}
	return src
}

// containerLog reads the log of container name of sandbox id as StreamLogs does.
func containerLog(t *testing.T, b *Backend, id, name string) string {
	t.Helper()
	r, err := b.OpenContainerLog(id, name)
	if err != nil {
		t.Fatalf("%s/%s: log: %v", id, name, err)
	}
	defer r.Close()
	var got []byte
	if _, err := r.Read(logstore.ReadOptions{}, func(c logstore.Chunk) error { got = append(got, c.Data...); return nil }); err != nil {
		t.Fatalf("%s/%s: log: %v", id, name, err)
	}
	return string(got)
}

// checkEnded checks group id on b (a fork, moved or resumed group of src's source): its
// ended sidecars show exited as the source recorded them (exit code, reason, message,
// restarts, finish time), their logs are the source's (never run again), the app and
// "side" run.
func checkEnded(t *testing.T, b *Backend, id, when string, src endedSource) {
	t.Helper()
	sts, err := b.ContainerStatuses(context.Background(), id)
	if err != nil {
		t.Fatalf("%s: statuses: %v", when, err)
	}
	got := map[string]runtime.ContainerStatus{}
	for _, st := range sts {
		got[st.Name] = st
	}
	for _, n := range []string{"app", "side"} {
		if got[n].State != runtime.ContainerRunning {
			t.Errorf("%s: %s %+v, want running", when, n, got[n])
		}
	}
	for _, n := range endedNames {
		want, st := src.exits[n], got[n]
		if st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != *want.ExitCode || st.Reason != want.Reason ||
			st.Message != want.Message || st.Restarts != want.Restarts {
			t.Errorf("%s: %s %+v (exit code %v), want exited as the source's %+v", when, n, st, st.ExitCode, want)
		}
		var ex runtime.Exit
		if err := readJSON(filepath.Join(memberDir(b.dir(id), n), fileExit), &ex); err != nil || !ex.At.Equal(want.At) ||
			ex.ExitCode == nil || *ex.ExitCode != *want.ExitCode || ex.Reason != want.Reason || ex.Restarts != want.Restarts {
			t.Errorf("%s: %s's recorded exit %+v (%v), the source's %+v", when, n, ex, err, want)
		}
		if log := containerLog(t, b, id, n); log != src.logs[n] {
			t.Errorf("%s: %s's log %q, want the source's %q (never run again)", when, n, log, src.logs[n])
		}
	}
}

// checkContinues checks that the app's and side's counters of group id on b continue
// from at least a1, s1 (the source's before its checkpoint) and go on.
func checkContinues(t *testing.T, b *Backend, id, when string, a1, s1, most int) {
	t.Helper()
	fa, fs := count(t, b, id), groupCounter(t, b, id, "side")
	if fa < a1 || fs < s1 || fa > a1+most || fs > s1+most {
		t.Errorf("%s: counters %d, %d; want from %d, %d (at most %d more): not continued from memory", when, fa, fs, a1, s1, most)
	}
	waitCount(t, b, id, fa+2)
	waitFor(t, func() bool { return groupCounter(t, b, id, "side") >= fs+2 })
}

// TestGVisorGroupEndedSidecar: a gVisor group with a sidecar that completed and one that
// failed after its restart limit forks (running, twice at once; checkpointed), pauses
// and resumes, forks to another runner and moves there through an export: every made
// group shows both sidecars exited as the source recorded them, with the source's logs
// (never run again), and its app and running sidecar continue their memory. Forged
// records of an ended sidecar in the export are refused, leaving nothing.
func TestGVisorGroupEndedSidecar(t *testing.T) {
	e := exportEnv(t)
	e2 := exportEnv(t) // the other runner
	ctx := context.Background()
	store := newCkStore(t)
	const id = "gend"
	sp := endedGroupSpec(id)
	e.create(sp)
	src := waitEnded(t, e.b, id)
	waitCount(t, e.b, id, 2)
	waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= 2 })
	checkEnded(t, e.b, id, "source", src)
	pinned := func(fid string) *runtime.Spec {
		f := sp.Clone()
		f.ID = fid
		f.Image = "busybox@sha256:b0b0"
		return &f
	}
	plain := func(fid string) *runtime.Spec { // a local fork's: the source's image
		f := sp.Clone()
		f.ID = fid
		return &f
	}
	destroy := func(b *Backend, state string, ids ...string) {
		t.Helper()
		for _, x := range ids {
			if err := b.Destroy(ctx, x); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t, state, x)
		}
	}

	// Two forks of the running group at once.
	a1, s1 := count(t, e.b, id), groupCounter(t, e.b, id, "side")
	start := time.Now()
	_, errs := e.b.Fork(ctx, id, []*runtime.Spec{plain("gend-f1"), plain("gend-f2")})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d of a group with ended sidecars: %v", i, err)
		}
	}
	t.Logf("fork ×2 of a group with ended sidecars: %v", time.Since(start))
	most := int(time.Since(start)/(100*time.Millisecond)) + 20
	for _, fid := range []string{"gend-f1", "gend-f2"} {
		checkEnded(t, e.b, fid, "fork "+fid, src)
		checkContinues(t, e.b, fid, "fork "+fid, a1, s1, most)
	}
	checkEnded(t, e.b, id, "source after the forks", src)
	destroy(e.b, e.state, "gend-f1", "gend-f2")

	// Paused releasing its resources: a fork of the checkpoint, then the resume.
	a1, s1 = count(t, e.b, id), groupCounter(t, e.b, id, "side")
	since := time.Now()
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("pause of a group with ended sidecars: %v", err)
	}
	if _, errs := e.b.Fork(ctx, id, []*runtime.Spec{plain("gend-fc")}); errs[0] != nil {
		t.Fatalf("fork of the checkpointed group: %v", errs[0])
	}
	checkEnded(t, e.b, "gend-fc", "fork of the checkpoint", src)
	checkContinues(t, e.b, "gend-fc", "fork of the checkpoint", a1, s1, int(time.Since(since)/(100*time.Millisecond))+20)
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	checkEnded(t, e.b, id, "resumed", src)
	checkContinues(t, e.b, id, "resumed", a1, s1, int(time.Since(since)/(100*time.Millisecond))+20)
	// A fork of the fork (its ended sidecars recorded, not run, in it too) pauses and
	// resumes with them recorded.
	if _, err := e.b.Pause(ctx, "gend-fc", true); err != nil {
		t.Fatalf("pause of the fork: %v", err)
	}
	if _, err := e.b.Resume(ctx, "gend-fc"); err != nil {
		t.Fatalf("resume of the fork: %v", err)
	}
	checkEnded(t, e.b, "gend-fc", "fork, paused and resumed", src)
	destroy(e.b, e.state, "gend-fc")

	// A cross-runner fork of the running group through an export.
	a1, s1 = count(t, e.b, id), groupCounter(t, e.b, id, "side")
	since = time.Now()
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("gef"))
	if err != nil {
		t.Fatalf("export of a running group with ended sidecars: %v", err)
	}
	if want := []string{"image", "run", "group", "member-0", "member-1", "member-2"}; !slices.Equal(ex.Parts, want) {
		t.Errorf("parts %v, want %v", ex.Parts, want)
	}
	if _, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gef"), []*runtime.Spec{pinned("gend-x")}); errs[0] != nil {
		t.Fatalf("fork on another backend: %v", errs[0])
	}
	checkNoImportLeft(t, e2)
	checkEnded(t, e2.b, "gend-x", "cross-runner fork", src)
	checkContinues(t, e2.b, "gend-x", "cross-runner fork", a1, s1, int(time.Since(since)/(100*time.Millisecond))+20)
	destroy(e2.b, e2.state, "gend-x")

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
	ex, err = e.b.ExportCheckpoint(ctx, id, store.put("gem"))
	if err != nil {
		t.Fatalf("export of a checkpointed group with ended sidecars: %v", err)
	}
	destroy(e.b, e.state, id)
	if _, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gem"), []*runtime.Spec{pinned(id)}); errs[0] != nil {
		t.Fatalf("move to another backend: %v", errs[0])
	}
	checkNoImportLeft(t, e2)
	checkEnded(t, e2.b, id, "moved", src)
	checkContinues(t, e2.b, id, "moved", a1, s1, int(time.Since(since)/(100*time.Millisecond))+20)
	// It pauses and resumes there, in a restarted backend too.
	if _, err := e2.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("pause of the moved group: %v", err)
	}
	b3 := e2.backend()
	if rs, err := b3.Recover(ctx); err != nil || len(rs) != 1 || !rs[0].Paused {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if _, err := b3.Resume(ctx, id); err != nil {
		t.Fatalf("resume of the moved group in a restarted backend: %v", err)
	}
	checkEnded(t, b3, id, "moved, resumed in a restarted backend", src)

	// group.json is the importing runner's untrusted input: forged records of an ended
	// sidecar (put in the store in place of the export's) are refused before any
	// sandbox is made, leaving nothing.
	member := func(name, ended string) string {
		return `{"name":"` + name + `","digest":"` + sideDigest + `","ended":{` + ended + `}}`
	}
	const at = `"finishedAt":"2026-12-04T22:00:00Z"`
	running := `{"name":"side","digest":"` + sideDigest + `"}`
	doneOK := member("done", `"exitCode":0,"restarts":0,"reason":"Completed","message":"",`+at)
	future := time.Now().Add(72 * time.Hour).UTC().Format(time.RFC3339)
	for what, members := range map[string]string{
		"exit code 256":   doneOK + `,` + member("flaky", `"exitCode":256,"restarts":1,"reason":"RestartLimit","message":"",`+at) + `,` + running,
		"exit code -1":    doneOK + `,` + member("flaky", `"exitCode":-1,"restarts":1,"reason":"RestartLimit","message":"",`+at) + `,` + running,
		"long message":    doneOK + `,` + member("flaky", `"exitCode":7,"restarts":1,"reason":"RestartLimit","message":"`+strings.Repeat("m", maxCompletedMessage+1)+`",`+at) + `,` + running,
		"future finish":   doneOK + `,` + member("flaky", `"exitCode":7,"restarts":1,"reason":"RestartLimit","message":"","finishedAt":"`+future+`"`) + `,` + running,
		"unknown reason":  doneOK + `,` + member("flaky", `"exitCode":7,"restarts":1,"reason":"Pwned","message":"",`+at) + `,` + running,
		"unknown name":    doneOK + `,` + member("other", `"exitCode":7,"restarts":1,"reason":"RestartLimit","message":"",`+at) + `,` + running,
		"extra container": doneOK + `,` + member("flaky", `"exitCode":7,"restarts":1,"reason":"RestartLimit","message":"",`+at) + `,` + running + `,` + member("extra", `"exitCode":0,"restarts":0,"reason":"Completed","message":"",`+at),
	} {
		var buf bytes.Buffer
		if err := fsarchive.WriteFiles(&buf, map[string][]byte{fileGroupExport: []byte(`{"members":[` + members + `]}`)}); err != nil {
			t.Fatal(err)
		}
		if err := store.put("gem")(ctx, partGroup, &buf); err != nil {
			t.Fatal(err)
		}
		if _, errs := e2.b.ForkFromCheckpoint(ctx, ex, store.open("gem"), []*runtime.Spec{pinned("gend-t")}); !errors.Is(errs[0], runtime.ErrInvalidSpec) {
			t.Errorf("forged group.json (%s): %v, want refused", what, errs[0])
		} else {
			t.Logf("forged group.json (%s): %v", what, errs[0])
		}
		checkNoLeaks(t, e2.state, "gend-t")
		checkNoImportLeft(t, e2)
	}
	destroy(b3, e2.state, id)
}

// TestGVisorGroupSidecarEndsDuringCheckpoint: a sidecar that ends during a checkpoint,
// after the checkpoint read which members had ended (testSaveHook kills it there and
// waits until runsc sees it stopped), is neither lost nor run twice: the checkpoint is
// taken again with it recorded as ended, for a fork (the fork shows it exited as the
// source recorded it, its other containers continue) and for a pause (the resumed group
// shows it exited, the others continue).
func TestGVisorGroupSidecarEndsDuringCheckpoint(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	const id = "gend-race"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
		Sidecars: []runtime.Container{
			{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
			{Name: "v1", Image: "busybox", Command: "sleep", Args: []string{"100000"}},
			{Name: "v2", Image: "busybox", Command: "sleep", Args: []string{"100000"}},
		}}
	e.create(sp)
	waitCount(t, e.b, id, 2)
	waitFor(t, func() bool { return groupCounter(t, e.b, id, "side") >= 2 })
	// killIn makes testSaveHook kill container name (its agent, the container's init) on
	// its first call, and wait until runsc has it stopped; it counts the calls.
	killIn := func(name string) *int {
		calls := new(int)
		testSaveHook = func(s *sandbox) {
			*calls++
			if *calls > 1 {
				return
			}
			m := s.container(name)
			if _, err := s.rt.run(ctx, "kill", m.cid, "KILL"); err != nil {
				t.Errorf("kill %s: %v", name, err)
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for !e.b.memberStopped(ctx, s, m) {
				if time.Now().After(deadline) {
					t.Errorf("%s still running", name)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		t.Cleanup(func() { testSaveHook = nil })
		return calls
	}
	exited := func(b *Backend, id, name, when string) runtime.Exit {
		t.Helper()
		var ex runtime.Exit
		if err := readJSON(filepath.Join(memberDir(b.dir(id), name), fileExit), &ex); err != nil {
			t.Fatalf("%s: %s's exit: %v", when, name, err)
		}
		sts, err := b.ContainerStatuses(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range sts {
			want := runtime.ContainerRunning
			if st.Name == name || (name == "v2" && st.Name == "v1") {
				want = runtime.ContainerExited
			}
			if st.State != want {
				t.Errorf("%s: %s %+v, want %s", when, st.Name, st, want)
			}
			if st.Name == name && st.Reason != ex.Reason {
				t.Errorf("%s: %s's reason %q, its recorded exit's %q", when, name, st.Reason, ex.Reason)
			}
		}
		return ex
	}

	// A fork: v1 ends during its checkpoint.
	calls := killIn("v1")
	a1, s1 := count(t, e.b, id), groupCounter(t, e.b, id, "side")
	f := sp.Clone()
	f.ID = "gend-race-f"
	if _, errs := e.b.Fork(ctx, id, []*runtime.Spec{&f}); errs[0] != nil {
		t.Fatalf("fork with a sidecar ending during the checkpoint: %v", errs[0])
	}
	if *calls != 2 {
		t.Errorf("checkpoints tried: %d, want 2 (the second with v1 recorded)", *calls)
	}
	src := exited(e.b, id, "v1", "source after the fork")
	if fex := exited(e.b, f.ID, "v1", "fork"); !fex.At.Equal(src.At) || fex.Reason != src.Reason || !reflect.DeepEqual(fex.ExitCode, src.ExitCode) {
		t.Errorf("fork's v1 exit %+v, the source's %+v", fex, src)
	}
	checkContinues(t, e.b, f.ID, "fork", a1, s1, 100)
	if err := e.b.Destroy(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, f.ID)

	// A pause releasing resources: v2 ends during its checkpoint.
	calls = killIn("v2")
	a1, s1 = count(t, e.b, id), groupCounter(t, e.b, id, "side")
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatalf("pause with a sidecar ending during the checkpoint: %v", err)
	}
	if *calls != 2 {
		t.Errorf("checkpoints tried: %d, want 2 (the second with v2 recorded)", *calls)
	}
	testSaveHook = nil
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	exited(e.b, id, "v2", "resumed")
	checkContinues(t, e.b, id, "resumed", a1, s1, 100)
	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}
