package local

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// counterLoop counts in a shell variable (memory) and shows the count in /tmp/cnt.
const counterLoop = "i=0; while :; do i=$((i+1)); echo $i > /tmp/cnt.t; mv /tmp/cnt.t /tmp/cnt; sleep 0.1; done"

func count(t testing.TB, b *Backend, id string) int {
	t.Helper()
	n, err := strconv.Atoi(sh(t, b, id, "cat /tmp/cnt 2>/dev/null || echo 0"))
	if err != nil {
		t.Fatalf("count of %s: %v", id, err)
	}
	return n
}

func waitCount(t testing.TB, b *Backend, id string, min int) int {
	t.Helper()
	var n int
	waitFor(t, func() bool { n = count(t, b, id); return n >= min })
	return n
}

// TestPauseFreeze pauses a runc sandbox by freezing it: its counter stops while it is
// frozen, the agent is refused with ErrPaused, pausing twice and resuming a running one
// are errors, and it continues after Resume. A checkpoint is refused naming the class
// that can.
func TestPauseFreeze(t *testing.T) {
	for _, class := range []string{"runc", GVisorClass} {
		t.Run(class, func(t *testing.T) { testPauseFreeze(t, class) })
	}
}

func testPauseFreeze(t *testing.T, class string) {
	e := newEnv(t)
	if e.b.runtimes[class] == nil {
		t.Skip("runsc not found")
	}
	const id = "frz-1"
	e.create(runtime.Spec{ID: id, RuntimeClass: class, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}})
	ctx := context.Background()
	if class == "runc" {
		sup := e.b.PauseSupport("")
		if !sup.Freeze || sup.Checkpoint || !strings.Contains(sup.Why, "gvisor") || !strings.Contains(sup.Why, "criu") {
			t.Errorf("PauseSupport(runc) = %+v", sup)
		}
		if _, err := e.b.Pause(ctx, id, true); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Errorf("checkpoint under runc: %v, want ErrNotImplemented", err)
		}
		if _, errs := e.b.Fork(ctx, id, []*runtime.Spec{{ID: "frz-f"}}); !errors.Is(errs[0], errdefs.ErrNotImplemented) {
			t.Errorf("fork under runc: %v, want ErrNotImplemented", errs[0])
		}
	}
	if _, err := e.b.Resume(ctx, id); !errors.Is(err, runtime.ErrNotPaused) {
		t.Errorf("resume of a running sandbox: %v", err)
	}
	c1 := waitCount(t, e.b, id, 2)
	pi, err := e.b.Pause(ctx, id, false)
	if err != nil || pi.Released || pi.CheckpointBytes != 0 {
		t.Fatalf("pause: %+v, %v", pi, err)
	}
	if _, err := e.b.Pause(ctx, id, false); !errors.Is(err, runtime.ErrAlreadyPaused) {
		t.Errorf("second pause: %v", err)
	}
	if _, err := e.b.DialAgent(ctx, id, ""); !errors.Is(err, runtime.ErrPaused) {
		t.Errorf("dial while paused: %v", err)
	}
	// A restarted backend finds it frozen.
	rs, err := e.backend().Recover(ctx)
	if err != nil || len(rs) != 1 || !rs[0].Paused || rs[0].Released || rs[0].Alive || rs[0].Exit != nil {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	if ex, err := e.b.Wait(wctx, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait while paused = %+v, %v", ex, err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	c2 := count(t, e.b, id)
	if c2-c1 > 3 {
		t.Errorf("counter went from %d to %d across 0.7 s frozen", c1, c2)
	}
	waitCount(t, e.b, id, c2+3)
	if _, err := os.Stat(filepath.Join(e.b.dir(id), filePaused)); err == nil {
		t.Error("paused marker left after resume")
	}
	// Stop of a frozen sandbox thaws it and stops it.
	if _, err := e.b.Pause(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := e.b.Stop(sctx, id, time.Second); err != nil {
		t.Fatalf("stop frozen: %v", err)
	}
	if _, err := e.b.Wait(sctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestPauseCheckpoint checkpoints a gVisor sandbox (network, a scratch volume): its
// processes end and its cgroups go, Wait blocks, the agent is refused; Resume restores
// it with the same address, its counter continuing from memory, the files of its root
// filesystem and volume intact, across two cycles with writes in between. A restarted
// backend reports it paused and resumes it; Stop while checkpointed ends it.
func TestPauseCheckpoint(t *testing.T) {
	e := volPoolEnv(t)
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	m := e.withNetwork(t, 6)
	ctx := context.Background()
	const id = "ck-1"
	sp := volSpec(id, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, counterLoop)
	info := e.create(sp)
	if sup := e.b.PauseSupport(GVisorClass); !sup.Freeze || !sup.Checkpoint {
		t.Errorf("PauseSupport(gvisor) = %+v", sup)
	}
	sh(t, e.b, id, "echo r1 > /rootfile; echo v1 > /data/f1; mkdir -p /www; echo web > /www/index.html; httpd -p 8080 -h /www")
	hc := markedClient(m)
	get := func() string {
		t.Helper()
		resp, err := hc.Get("http://" + info.IP + ":8080/index.html")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := get(); got != "web\n" {
		t.Fatalf("GET before pause = %q", got)
	}
	for cycle := 1; cycle <= 2; cycle++ {
		c1 := waitCount(t, e.b, id, 3*cycle)
		pi, err := e.b.Pause(ctx, id, true)
		if err != nil {
			t.Fatalf("cycle %d: pause: %v", cycle, err)
		}
		t.Logf("cycle %d: pause %v, checkpoint %d bytes", cycle, pi.Took, pi.CheckpointBytes)
		if !pi.Released || pi.CheckpointBytes <= 0 {
			t.Errorf("pause info %+v", pi)
		}
		if got := mustGlob("/sys/fs/cgroup/*/" + testCgroupParent + "/" + id); len(got) > 0 {
			t.Errorf("cgroups left while checkpointed: %v", got)
		}
		if _, err := e.b.DialAgent(ctx, id, ""); !errors.Is(err, runtime.ErrPaused) {
			t.Errorf("dial while checkpointed: %v", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if ex, err := e.b.Wait(wctx, id); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait while checkpointed = %+v, %v", ex, err)
		}
		cancel()
		if _, err := e.b.Pause(ctx, id, false); !errors.Is(err, runtime.ErrAlreadyPaused) {
			t.Errorf("pause of a checkpointed sandbox: %v", err)
		}
		start := time.Now()
		ri, err := e.b.Resume(ctx, id)
		if err != nil {
			t.Fatalf("cycle %d: resume: %v", cycle, err)
		}
		t.Logf("cycle %d: resume %v", cycle, time.Since(start))
		if ri.IP != info.IP {
			t.Errorf("IP after resume %q, was %q", ri.IP, info.IP)
		}
		c2 := count(t, e.b, id)
		if c2 < c1 || c2 > c1+10 {
			t.Errorf("cycle %d: counter %d before, %d after resume: not continued", cycle, c1, c2)
		}
		waitCount(t, e.b, id, c2+2)
		if out := sh(t, e.b, id, "cat /rootfile /data/f1"); out != "r1\nv1" {
			t.Errorf("cycle %d: files = %q", cycle, out)
		}
		if cycle == 2 {
			if out := sh(t, e.b, id, "cat /rootfile2 /data/f2"); out != "r2\nv2" {
				t.Errorf("files written between cycles = %q", out)
			}
		}
		if out := sh(t, e.b, id, "ip -4 addr"); !strings.Contains(out, info.IP+"/") {
			t.Errorf("eth0 after resume: %q", out)
		}
		if got := get(); got != "web\n" {
			t.Errorf("cycle %d: GET of the server in the sandbox after resume = %q", cycle, got)
		}
		sh(t, e.b, id, "echo r2 > /rootfile2; echo v2 > /data/f2")
		if _, err := os.Stat(filepath.Join(e.b.dir(id), dirCheckpoint)); err == nil {
			t.Error("checkpoint left after resume")
		}
	}

	// A restarted backend finds it checkpointed, and resumes it.
	c1 := count(t, e.b, id)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	b2 := e.backend()
	b2.cfg.Network = e.b.cfg.Network
	rs, err := b2.Recover(ctx)
	if err != nil || len(rs) != 1 || !rs[0].Paused || !rs[0].Released || rs[0].Alive || rs[0].Exit != nil {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	if _, err := b2.DialAgent(ctx, id, ""); !errors.Is(err, runtime.ErrPaused) {
		t.Errorf("dial while checkpointed (restarted backend): %v", err)
	}
	if _, err := b2.Resume(ctx, id); err != nil {
		t.Fatalf("resume in a restarted backend: %v", err)
	}
	if c2 := count(t, b2, id); c2 < c1 {
		t.Errorf("counter %d after resume in a restarted backend, was %d", c2, c1)
	}
	if out := sh(t, b2, id, "cat /rootfile2 /data/f2"); out != "r2\nv2" {
		t.Errorf("files = %q", out)
	}

	// Stop while checkpointed.
	if _, err := b2.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b2.Stop(sctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	ex, err := b2.Wait(sctx, id)
	if err != nil || ex.Reason != "Stopped" || ex.Message != "stopped while paused" {
		t.Errorf("wait after stop while paused = %+v, %v", ex, err)
	}
	if _, err := os.Stat(filepath.Join(b2.dir(id), dirCheckpoint)); err == nil {
		t.Error("checkpoint left after stop")
	}
	if err := b2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
}

// TestFork forks a running gVisor sandbox three times, then a checkpointed one: each
// fork continues the source's counter from memory on its own, has its own address, the
// source's root filesystem and volume files, and its writes are its own. Destroy leaves
// nothing.
func TestFork(t *testing.T) {
	e := volPoolEnv(t)
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	e.withNetwork(t, 7)
	ctx := context.Background()
	const src = "fk-src"
	sp := volSpec(src, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, counterLoop)
	sp.Image = "busybox"
	srcInfo := e.create(sp)
	sh(t, e.b, src, "echo r > /rootfile; echo v > /data/f")
	// The agent's state dir is copied into each fork: what the sandbox plants there is
	// copied as it is, never followed on the host.
	sh(t, e.b, src, "ln -s /etc/shadow /.sandboxd/run/evil; ln -s / /.sandboxd/run/root")
	c0 := waitCount(t, e.b, src, 5)
	specs := make([]*runtime.Spec, 3)
	for i := range specs {
		f := sp.Clone()
		f.ID = "fk-" + strconv.Itoa(i)
		specs[i] = &f
	}
	start := time.Now()
	infos, errs := e.b.Fork(ctx, src, specs)
	t.Logf("fork x3 of a running sandbox: %v", time.Since(start))
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
	for i := range specs {
		id := specs[i].ID
		if n := count(t, e.b, id); n < c0 {
			t.Errorf("fork %s: counter %d, source had %d", id, n, c0)
		}
		if out := sh(t, e.b, id, "cat /rootfile /data/f; hostname"); out != "r\nv\n"+id {
			t.Errorf("fork %s: files and hostname = %q", id, out)
		}
		if out := sh(t, e.b, id, "ip -4 addr"); !strings.Contains(out, infos[i].IP+"/") {
			t.Errorf("fork %s: addresses %q, want %s", id, out, infos[i].IP)
		}
		sh(t, e.b, id, "echo "+id+" > /rootfile; echo "+id+" > /data/f")
		for _, n := range []string{"evil", "root"} {
			if fi, err := os.Lstat(filepath.Join(shownDir(e.b.dir(id)), dirRun, n)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("fork %s: run/%s on the host: %v, %v: want the symlink as planted", id, n, fi, err)
			}
		}
	}
	// The source ran on; each fork's writes are its own.
	waitCount(t, e.b, src, c0+3)
	if out := sh(t, e.b, src, "cat /rootfile /data/f"); out != "r\nv" {
		t.Errorf("source's files after the forks wrote = %q", out)
	}
	for i := range specs {
		id := specs[i].ID
		if out := sh(t, e.b, id, "cat /rootfile /data/f"); out != id+"\n"+id {
			t.Errorf("fork %s files = %q", id, out)
		}
		waitCount(t, e.b, id, c0+3)
	}

	// A checkpointed source is forked from its checkpoint and stays paused.
	if _, err := e.b.Pause(ctx, src, true); err != nil {
		t.Fatal(err)
	}
	f := sp.Clone()
	f.ID = "fk-p"
	infos, errs = e.b.Fork(ctx, src, []*runtime.Spec{&f})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if out := sh(t, e.b, "fk-p", "cat /rootfile /data/f"); out != "r\nv" {
		t.Errorf("fork of the paused source: files %q", out)
	}
	if !e.b.isPaused(src) {
		t.Error("the paused source is no longer paused after a fork")
	}
	if _, err := e.b.Resume(ctx, src); err != nil {
		t.Fatal(err)
	}
	// A fork that fails leaves nothing: a spec whose ID exists.
	bad := sp.Clone()
	bad.ID = "fk-0"
	if _, errs := e.b.Fork(ctx, src, []*runtime.Spec{&bad}); errs[0] == nil {
		t.Error("fork onto an existing ID succeeded")
	}
	for _, id := range []string{"fk-0", "fk-1", "fk-2", "fk-p", src} {
		if err := e.b.Destroy(ctx, id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
		checkNoLeaks(t, e.state, id)
	}
	_ = infos
}

// TestPauseCheckpointFails: a checkpoint that fails half way (runsc finds its image
// dir full: a 256 KiB tmpfs) is discarded and leaves the sandbox running as it was: its
// counter goes on, its agent answers, nothing of the checkpoint is left, it is not
// paused, and a later checkpoint works.
func TestPauseCheckpointFails(t *testing.T) {
	e := gvisorEnv(t)
	ctx := context.Background()
	const id = "ckf-1"
	e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}})
	var mounted []string
	testImageDirHook = func(dir string) error {
		mounted = append(mounted, dir)
		return unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256k")
	}
	t.Cleanup(func() {
		testImageDirHook = nil
		for _, d := range mounted {
			_ = unix.Unmount(d, unix.MNT_DETACH)
			_ = os.Remove(d)
		}
	})
	c1 := waitCount(t, e.b, id, 2)
	if _, err := e.b.Pause(ctx, id, true); err == nil {
		t.Fatal("a checkpoint into a full dir succeeded")
	} else {
		t.Logf("pause: %v", err)
	}
	// A fork's checkpoint fails the same way: its forks, made while it is taken, all fail
	// with its error and are undone; the source runs on.
	forks := []*runtime.Spec{
		{ID: "ckf-f1", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}},
		{ID: "ckf-f2", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}},
	}
	_, errs := e.b.Fork(ctx, id, forks)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "fork "+id+": runsc could not checkpoint") {
			t.Errorf("fork %d of a failed checkpoint: %v", i, err)
		}
		if _, serr := os.Stat(e.b.dir(forks[i].ID)); !os.IsNotExist(serr) {
			t.Errorf("fork %s of a failed checkpoint left its dir (%v)", forks[i].ID, serr)
		}
	}
	testImageDirHook = nil
	waitCount(t, e.b, id, c1+3)
	if e.b.isPaused(id) {
		t.Error("paused after a failed checkpoint")
	}
	for _, d := range mounted {
		_ = unix.Unmount(d, unix.MNT_DETACH)
		_ = os.Remove(d)
	}
	ents, _ := os.ReadDir(e.b.dir(id))
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), dirCheckpoint) || ent.Name() == filePaused {
			t.Errorf("left after a failed checkpoint: %s", ent.Name())
		}
	}
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitCount(t, e.b, id, c1+5)
}

// TestPauseFreezeGroup freezes a group (runc: the group's cgroup; gVisor: its one
// sentry): both containers stop counting, every container's agent is refused with
// ErrPaused, a checkpoint of the group is refused, Resume continues both and Stop ends it.
func TestPauseFreezeGroup(t *testing.T) {
	for _, class := range []string{"runc", GVisorClass} {
		t.Run(class, func(t *testing.T) {
			e := newEnv(t)
			if e.b.runtimes[class] == nil {
				t.Skip("runsc not found")
			}
			ctx := context.Background()
			const id = "frzg"
			sp := runtime.Spec{ID: id, RuntimeClass: class,
				Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}},
				Sidecars:  []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}}
			e.create(sp)
			side := func() int {
				out, _, _ := execIn(t, agentClientOf(e.b, id, "side"), "sh", "-c", "cat /tmp/cnt 2>/dev/null || echo 0")
				n, _ := strconv.Atoi(strings.TrimSpace(out))
				return n
			}
			waitCount(t, e.b, id, 2)
			waitFor(t, func() bool { return side() >= 2 })
			a1, s1 := count(t, e.b, id), side()
			if _, err := e.b.Pause(ctx, id, false); err != nil {
				t.Fatal(err)
			}
			if _, err := e.b.Pause(ctx, id, false); !errors.Is(err, runtime.ErrAlreadyPaused) {
				t.Errorf("second pause: %v", err)
			}
			for _, name := range []string{"", "side"} {
				if _, err := e.b.DialAgent(ctx, id, name); !errors.Is(err, runtime.ErrPaused) {
					t.Errorf("dial %q while paused: %v", name, err)
				}
			}
			time.Sleep(700 * time.Millisecond)
			if _, err := e.b.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
			if a2, s2 := count(t, e.b, id), side(); a2-a1 > 3 || s2-s1 > 3 {
				t.Errorf("counters went %d->%d and %d->%d across 0.7 s frozen", a1, a2, s1, s2)
			}
			waitCount(t, e.b, id, a1+4)
			waitFor(t, func() bool { return side() >= s1+4 })
			if _, err := e.b.Pause(ctx, id, false); err != nil {
				t.Fatal(err)
			}
			sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := e.b.Stop(sctx, id, time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := e.b.Wait(sctx, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPauseForkDiskLimit: a gVisor sandbox with a disk limit (its writable layer on a
// disk image of its own, disk.go) is checkpointed, resumed and forked like one without.
func TestPauseForkDiskLimit(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.DiskBytes = 128 << 20 })
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	ctx := context.Background()
	const id = "pdl"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}
	e.create(sp)
	sh(t, e.b, id, "echo r > /rootfile")
	c1 := waitCount(t, e.b, id, 2)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	f := sp.Clone()
	f.ID = "pdl-f"
	if _, errs := e.b.Fork(ctx, id, []*runtime.Spec{&f}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for _, x := range []string{id, f.ID} {
		if n := waitCount(t, e.b, x, c1+2); n < c1 {
			t.Errorf("%s: counter %d", x, n)
		}
		if out := sh(t, e.b, x, "cat /rootfile"); out != "r" {
			t.Errorf("%s: /rootfile = %q", x, out)
		}
	}
}

// checkpointFDs lists the descriptors of process pid open on a checkpoint image's files
// (pages.img etc. in a dir named checkpoint; the sentry sees paths from its own root,
// and "(deleted)" follows a removed one).
func checkpointFDs(pid int) []string {
	ents, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	var held []string
	for _, e := range ents {
		l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + e.Name())
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(l, " (deleted)")
		if filepath.Base(filepath.Dir(name)) == dirCheckpoint && strings.HasSuffix(name, ".img") {
			held = append(held, l)
		}
	}
	return held
}

// TestPauseBackgroundRestore: a resume restores with `runsc restore --background` (the
// sandbox runs while its memory image loads). The sandbox's 128 MiB of memory are intact
// after a resume and after a pause taken at once after a resume (while pages may still
// load); the checkpoint's name is gone when Resume returns and, once the load has ended
// (`runsc wait --restore`), no descriptor of the sentry holds its data (its space is
// free). Destroy at once after a resume leaves nothing behind.
func TestPauseBackgroundRestore(t *testing.T) {
	if !restoreBackground {
		t.Fatal("restores are not in the background")
	}
	e := gvisorEnv(t)
	e.withNetwork(t, 7)
	ctx := context.Background()
	const id = "bgr-1"
	e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"100000"},
		Resources: runtime.Resources{MemoryBytes: 1 << 30}}})
	sh(t, e.b, id, "dd if=/dev/urandom of=/tmp/fill bs=1M count=128 2>/dev/null")
	want := sh(t, e.b, id, "md5sum /tmp/fill")
	dir := e.b.dir(id)
	image := filepath.Join(dir, dirCheckpoint)
	pauseResume := func() {
		t.Helper()
		if _, err := e.b.Pause(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		if _, err := e.b.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(image); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("checkpoint still there after Resume: %v", err)
		}
	}
	pauseResume()
	pauseResume() // the second pause at once after a resume
	if got := sh(t, e.b, id, "md5sum /tmp/fill"); got != want {
		t.Errorf("memory after two background restores: %q, want %q", got, want)
	}
	s, err := e.b.get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.rt.run(ctx, "wait", "--restore", s.cid); err != nil {
		t.Fatalf("runsc wait --restore: %v", err)
	}
	if held := checkpointFDs(s.info.Pid); len(held) > 0 {
		t.Errorf("the sentry holds the checkpoint after its load ended: %v", held)
	}
	// Destroy while the image may still be loading.
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left after Destroy: %v", err)
	}
	checkNoLeaks(t, e.state, id)
}
