package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// pauseFake is a runtimetest.Fake that pauses, resumes and forks with the contract's
// semantics (runtime.Pauser, runtime.Forker): while a sandbox is paused DialAgent is
// runtime.ErrPaused and Wait goes on blocking; a checkpoint (release) ends every
// connection to its agents, as a checkpoint ends its processes; Stop ends a paused
// sandbox; Recover reports a paused one Paused (Released for a checkpoint).
type pauseFake struct {
	*runtimetest.Fake
	sup runtime.PauseSupport

	mu       sync.Mutex
	paused   map[string]bool // id → released
	conns    map[string][]net.Conn
	pauses   int
	resumes  int
	forks    int
	forkFail map[string]error // fork target ID → its error
	// forkValues are the egress secret values each fork's spec brought (by fork ID).
	forkValues map[string]map[string]string
	// onPause, when set, runs inside Pause before it pauses (a test blocks it there).
	onPause func(id string)
	// caExpiry is when each sandbox's egress CA expires (runtime.EgressCAExpirer).
	caExpiry map[string]time.Time
	// refuse, when set, is Pause's answer for every sandbox (a backend's refusal of one
	// sandbox that its runtime class could otherwise be paused by).
	refuse error
}

func (f *pauseFake) EgressCAExpiry(id string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.caExpiry[id]
	return at, ok
}

var (
	_ runtime.Pauser          = (*pauseFake)(nil)
	_ runtime.Forker          = (*pauseFake)(nil)
	_ runtime.EgressCAExpirer = (*pauseFake)(nil)
)

func newPauseFake(sup runtime.PauseSupport) *pauseFake {
	return &pauseFake{Fake: runtimetest.NewFake(), sup: sup, paused: map[string]bool{}, conns: map[string][]net.Conn{}, forkFail: map[string]error{}}
}

func (f *pauseFake) PauseSupport(string) runtime.PauseSupport { return f.sup }

func (f *pauseFake) DialAgent(ctx context.Context, id, container string) (net.Conn, error) {
	f.mu.Lock()
	_, paused := f.paused[id]
	f.mu.Unlock()
	if paused {
		return nil, fmt.Errorf("dial agent of %s: %w", id, runtime.ErrPaused)
	}
	c, err := f.Fake.DialAgent(ctx, id, container)
	if err == nil {
		f.mu.Lock()
		f.conns[id] = append(f.conns[id], c)
		f.mu.Unlock()
	}
	return c, err
}

func (f *pauseFake) Pause(_ context.Context, id string, release bool) (runtime.PauseInfo, error) {
	if f.onPause != nil {
		f.onPause(id)
	}
	if f.refuse != nil {
		return runtime.PauseInfo{}, f.refuse
	}
	sb := f.Sandbox(id, 0)
	if sb == nil || !sb.Alive() {
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.paused[id]; ok {
		return runtime.PauseInfo{}, runtime.ErrAlreadyPaused
	}
	if release && !f.sup.Checkpoint || !release && !f.sup.Freeze {
		return runtime.PauseInfo{}, errdefs.ErrNotImplemented
	}
	f.pauses++
	f.paused[id] = release
	info := runtime.PauseInfo{Released: release, Took: time.Millisecond}
	if release {
		info.CheckpointBytes = 4096
		for _, c := range f.conns[id] {
			_ = c.Close() // its processes, the agent's too, end
		}
		f.conns[id] = nil
	}
	return info, nil
}

func (f *pauseFake) Resume(_ context.Context, id string) (runtime.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.paused[id]; !ok {
		return runtime.Info{}, runtime.ErrNotPaused
	}
	f.resumes++
	delete(f.paused, id)
	return runtime.Info{ID: id, IP: "192.0.2.1"}, nil
}

func (f *pauseFake) Stop(ctx context.Context, id string, grace time.Duration) error {
	f.mu.Lock()
	delete(f.paused, id)
	f.mu.Unlock()
	return f.Fake.Stop(ctx, id, grace)
}

func (f *pauseFake) Recover(ctx context.Context) ([]runtime.Recovered, error) {
	recs, err := f.Fake.Recover(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, rec := range recs {
		if released, ok := f.paused[rec.Spec.ID]; ok && rec.Alive {
			recs[i].Alive, recs[i].Paused, recs[i].Released = false, true, released
		}
	}
	return recs, err
}

func (f *pauseFake) Fork(_ context.Context, src string, specs []*runtime.Spec) ([]runtime.Info, []error) {
	f.mu.Lock()
	f.forks++
	f.mu.Unlock()
	infos, errs := make([]runtime.Info, len(specs)), make([]error, len(specs))
	for i, s := range specs {
		if err := f.forkFail[s.ID]; err != nil {
			errs[i] = err
			continue
		}
		if s.EgressSecretValues != nil {
			f.mu.Lock()
			if f.forkValues == nil {
				f.forkValues = map[string]map[string]string{}
			}
			f.forkValues[s.ID] = maps.Clone(s.EgressSecretValues)
			f.mu.Unlock()
		}
		infos[i] = runtime.Info{ID: s.ID, IP: fmt.Sprintf("192.0.2.%d", 10+i), RuntimeClass: "fake", StartedAt: time.Now()}
		f.Put(runtime.Recovered{Spec: *s, Info: infos[i], Alive: true})
	}
	return infos, errs
}

func (f *pauseFake) counts() (pauses, resumes, forks int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pauses, f.resumes, f.forks
}

var checkpointing = runtime.PauseSupport{Freeze: true, Checkpoint: true}

// pauseLocal is a Local (2 CPUs, 8 GiB) over be on dataDir ("" = a new one).
func pauseLocal(t *testing.T, be runtime.Backend, dataDir string) *Local {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	r, err := New(context.Background(), Config{Backend: be, DataDir: dataDir, ExpiryGrace: 10 * time.Millisecond, IdleCheck: 20 * time.Millisecond, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	l := NewLocal("r1", r)
	l.MilliCPU, l.MemoryBytes = 2000, 8<<30
	return l
}

// runningSandbox creates a sandbox with meta and lifetime and waits for it to run.
func runningSandbox(t *testing.T, l *Local, meta map[string]string, lifetime time.Duration) Sandbox {
	t.Helper()
	sb, err := l.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Meta: meta}, Lifetime: lifetime})
	if err != nil {
		t.Fatal(err)
	}
	return awaitState(t, l.R, sb.ID, StateRunning)
}

func awaitState(t *testing.T, r *Runner, id string, st State) Sandbox {
	t.Helper()
	var sb Sandbox
	eventually(t, fmt.Sprintf("sandbox %s %s", id, st), func() bool {
		var err error
		sb, err = r.Get(id)
		return err == nil && sb.State == st
	})
	return sb
}

func exec(ctx context.Context, r *Runner, id string) error {
	a, err := r.Agent(ctx, id, "")
	if err != nil {
		return err
	}
	_, err = a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
	return err
}

// watched: the runner follows the sandbox's agent (a restart count it reports shows).
func watched(t *testing.T, be *pauseFake, r *Runner, id string, restarts int32) {
	t.Helper()
	be.Sandbox(id, time.Second).Report(&agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_RUNNING, RestartCount: restarts})
	eventually(t, "the agent's report reaches the runner", func() bool {
		sb, _ := r.Get(id)
		return sb.Restarts == int(restarts)
	})
}

// TestPauseCheckpointAndResume: a checkpoint pauses a RUNNING sandbox PAUSED (released,
// out of the runner's Used and Running), refuses exec without auto-resume and a second
// pause; Resume makes it RUNNING again with its agent followed again, and a resume of a
// running sandbox changes nothing.
func TestPauseCheckpointAndResume(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	before, _ := l.Capacity(ctx)

	p, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: false})
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StatePaused || p.Pause == nil || !p.Pause.Released || p.Pause.AutoResume || p.Pause.LifetimeHeld ||
		p.Pause.PausedAt.IsZero() || p.Pause.CheckpointBytes != 4096 {
		t.Fatalf("paused: %s %+v", p.State, p.Pause)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StatePaused || got.Pause == nil {
		t.Fatalf("Get: %s %+v", got.State, got.Pause)
	}
	c, _ := l.Capacity(ctx)
	if c.Paused != 1 || c.Running != before.Running-1 || c.UsedMilliCPU != before.UsedMilliCPU-100 || c.UsedMemoryBytes != before.UsedMemoryBytes-128<<20 {
		t.Errorf("capacity while checkpointed: paused %d running %d used %dm %d, before running %d used %dm %d",
			c.Paused, c.Running, c.UsedMilliCPU, c.UsedMemoryBytes, before.Running, before.UsedMilliCPU, before.UsedMemoryBytes)
	}
	if !slices.Equal(c.CheckpointClasses, c.RuntimeClasses) {
		t.Errorf("checkpoint classes %v, want all of %v", c.CheckpointClasses, c.RuntimeClasses)
	}
	err = exec(ctx, l.R, sb.ID)
	if !errors.Is(err, ErrPaused) || !errors.Is(err, ErrNotRunning) {
		t.Errorf("exec without auto-resume: %v, want ErrPaused", err)
	}
	if reason := apierr.Reason(APIError(sb.ID, err, "")); reason != apierr.SandboxNotRunning {
		t.Errorf("exec without auto-resume: reason %s", reason)
	}
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); !errors.Is(err, ErrAlreadyPaused) {
		t.Errorf("second pause: %v, want ErrAlreadyPaused", err)
	}
	if _, resumes, _ := be.counts(); resumes != 0 {
		t.Errorf("%d resumes without asking", resumes)
	}

	res, err := l.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != StateRunning || res.Pause != nil || !res.Deadline.Equal(sb.Deadline) {
		t.Fatalf("resumed: %s %+v deadline %s, want RUNNING, the deadline %s", res.State, res.Pause, res.Deadline, sb.Deadline)
	}
	if _, err := os.Stat(l.R.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("pause status file after resume: %v", err)
	}
	watched(t, be, l.R, sb.ID, 3) // its agent is followed again
	if err := exec(ctx, l.R, sb.ID); err != nil {
		t.Errorf("exec after resume: %v", err)
	}
	again, err := l.Resume(ctx, sb.ID)
	if err != nil || again.State != StateRunning {
		t.Errorf("resume of a running sandbox: %s %v", again.State, err)
	}
	if _, resumes, _ := be.counts(); resumes != 1 {
		t.Errorf("backend resumes %d, want 1", resumes)
	}
	if c, _ := l.Capacity(ctx); c.Paused != 0 || c.Running != before.Running {
		t.Errorf("capacity after resume: paused %d running %d", c.Paused, c.Running)
	}
}

// TestPauseFreezeAndRefusals: a runtime class that cannot checkpoint is frozen (still
// counted), refuses a pause releasing resources and a fork with the backend's reason
// (CWSANDBOX_CHECKPOINT_NOT_SUPPORTED), and a backend without Pauser refuses all.
func TestPauseFreezeAndRefusals(t *testing.T) {
	why := "runc needs CRIU: use the gvisor runtime class"
	be := newPauseFake(runtime.PauseSupport{Freeze: true, Why: why})
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	before, _ := l.Capacity(ctx)
	if len(before.CheckpointClasses) != 0 {
		t.Errorf("checkpoint classes %v, want none", before.CheckpointClasses)
	}

	_, err := l.Pause(ctx, sb.ID, PauseOptions{Release: ptr(true)})
	if !errors.Is(err, ErrCannotCheckpoint) || !strings.Contains(err.Error(), why) {
		t.Errorf("release on a class that cannot checkpoint: %v", err)
	}
	if ae := APIError(sb.ID, err, ""); apierr.Reason(ae) != apierr.CheckpointNotSupported || connect.CodeOf(ae) != connect.CodeFailedPrecondition {
		t.Errorf("API error %v", ae)
	}
	if _, err := l.Fork(ctx, sb.ID, []ForkTarget{{ID: "fork-1"}}); !errors.Is(err, ErrCannotCheckpoint) {
		t.Errorf("fork: %v, want ErrCannotCheckpoint", err)
	}
	p, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.State != StatePaused || p.Pause.Released || p.Pause.CheckpointBytes != 0 {
		t.Errorf("frozen: %s %+v", p.State, p.Pause)
	}
	c, _ := l.Capacity(ctx)
	if c.Paused != 1 || c.Running != before.Running || c.UsedMilliCPU != before.UsedMilliCPU {
		t.Errorf("capacity while frozen: paused %d running %d used %dm; before running %d used %dm", c.Paused, c.Running, c.UsedMilliCPU, before.Running, before.UsedMilliCPU)
	}

	plain := runtimetest.NewFake()
	t.Cleanup(plain.Close)
	pl := pauseLocal(t, plain, "")
	psb := runningSandbox(t, pl, nil, time.Hour)
	if _, err := pl.Pause(ctx, psb.ID, PauseOptions{}); !errors.Is(err, ErrCannotCheckpoint) || !strings.Contains(err.Error(), "cannot pause") {
		t.Errorf("pause on a backend without Pauser: %v", err)
	}
	if _, err := pl.Pause(ctx, "nope", PauseOptions{}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("pause of an unknown sandbox: %v", err)
	}
}

// TestPauseBackendRefusesSandbox: a backend that can checkpoint the sandbox's runtime class
// but refuses this sandbox (errdefs.ErrNotImplemented with its reason: the Kubernetes
// backend for a multi-container sandbox, one with volumes or egress secrets) is
// FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED with that reason, not INTERNAL,
// and the sandbox runs on.
func TestPauseBackendRefusesSandbox(t *testing.T) {
	why := "sandboxes with egress secrets cannot be paused on Kubernetes yet"
	be := newPauseFake(checkpointing)
	be.refuse = fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, why)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	_, err := l.Pause(ctx, sb.ID, PauseOptions{})
	if !errors.Is(err, ErrCannotCheckpoint) {
		t.Errorf("pause: %v, want ErrCannotCheckpoint", err)
	}
	ae := APIError(sb.ID, err, "")
	if apierr.Reason(ae) != apierr.CheckpointNotSupported || connect.CodeOf(ae) != connect.CodeFailedPrecondition || !strings.Contains(ae.Error(), why) {
		t.Errorf("API error %v, want FAILED_PRECONDITION %s naming the reason", ae, apierr.CheckpointNotSupported)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("after the refusal: %s, want RUNNING", got.State)
	}
}

// TestAutoResumeOnAgent: exec on a paused sandbox with auto-resume resumes it first, once
// for many concurrent callers.
func TestAutoResumeOnAgent(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = exec(ctx, l.R, sb.ID)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("exec %d: %v", i, err)
		}
	}
	if _, resumes, _ := be.counts(); resumes != 1 {
		t.Errorf("backend resumes %d, want 1", resumes)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("after exec: %s", got.State)
	}
}

// TestPausedLogsDoNotResume: the log of a paused sandbox is not read through its agent,
// and reading it does not resume the sandbox (a backend that keeps no log where the
// runner reads it answers ErrPaused).
func TestPausedLogsDoNotResume(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	err := l.Logs(ctx, sb.ID, "", &agentv1.LogsRequest{}, func(*agentv1.LogsResponse) error { return nil })
	if !errors.Is(err, ErrPaused) {
		t.Errorf("logs of a paused sandbox: %v, want ErrPaused", err)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StatePaused {
		t.Errorf("after logs: %s, want PAUSED", got.State)
	}
}

// TestPauseLifetimeHeld: a held lifetime does not run out while paused, and the deadline
// moves on by the time paused at resume (kept across a restart).
func TestPauseLifetimeHeld(t *testing.T) {
	be := newPauseFake(checkpointing)
	t.Cleanup(be.Close)
	dir := t.TempDir()
	l := pauseLocal(t, be, dir)
	ctx := context.Background()
	sb := runningSandbox(t, l, map[string]string{runtime.MetaPauseLifetime: "held"}, 500*time.Millisecond)
	p, err := l.Pause(ctx, sb.ID, PauseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Pause.LifetimeHeld {
		t.Fatalf("pause status %+v, want the lifetime held", p.Pause)
	}
	time.Sleep(800 * time.Millisecond) // past the deadline
	if got, _ := l.Get(ctx, sb.ID); got.State != StatePaused {
		t.Fatalf("after the deadline: %s, want PAUSED", got.State)
	}
	res, err := l.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lifetime < 1300*time.Millisecond || !res.Deadline.Equal(res.CreatedAt.Add(res.Lifetime)) || time.Until(res.Deadline) < 200*time.Millisecond {
		t.Fatalf("resumed: lifetime %s deadline in %s, want ≥ 1.3 s and ≥ 200ms left", res.Lifetime, time.Until(res.Deadline))
	}
	if d, ok := l.R.persistedLifetime(sb.ID); !ok || d != res.Lifetime {
		t.Errorf("persisted lifetime %s %v, want %s", d, ok, res.Lifetime)
	}
	// It runs out by its moved deadline.
	awaitState(t, l.R, sb.ID, StateCompleted)
}

// TestPauseLifetimeCounts: by default the lifetime counts while paused: a paused sandbox
// whose lifetime runs out ends COMPLETED LifetimeExceeded without being resumed.
func TestPauseLifetimeCounts(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, 400*time.Millisecond)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	got := awaitState(t, l.R, sb.ID, StateCompleted)
	if got.Reason != ReasonLifetimeExceeded || got.Pause != nil {
		t.Errorf("ended %s %s pause %+v", got.State, got.Reason, got.Pause)
	}
	if _, resumes, _ := be.counts(); resumes != 0 {
		t.Errorf("backend resumes %d, want 0", resumes)
	}
}

// TestDeletePaused: a paused sandbox is deleted TERMINATED without a resume.
func TestDeletePaused(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Delete(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	got, err := l.R.WaitTerminal(ctx, sb.ID)
	if err != nil || got.State != StateTerminated || got.Reason != ReasonDeleted {
		t.Fatalf("deleted: %s %s %v", got.State, got.Reason, err)
	}
	if _, resumes, _ := be.counts(); resumes != 0 {
		t.Errorf("backend resumes %d, want 0", resumes)
	}
	if _, err := l.Resume(ctx, sb.ID); !errors.Is(err, ErrNotRunning) {
		t.Errorf("resume of a deleted sandbox: %v", err)
	}
	if _, err := os.Stat(l.R.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("pause status file after delete: %v", err)
	}
}

// TestRestartReadoptsPaused: a restarted runner re-adopts a paused sandbox PAUSED as it
// was paused, resumes it and follows its agent again; a pause status file the backend
// does not confirm is dropped (the sandbox is what the backend says).
func TestRestartReadoptsPaused(t *testing.T) {
	be := newPauseFake(checkpointing)
	t.Cleanup(be.Close)
	dir := t.TempDir()
	l := pauseLocal(t, be, dir)
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	other := runningSandbox(t, l, nil, time.Hour)
	p, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: false})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(l.R.pausedPath(other.ID), []byte(`{"Released":true,"AutoResume":false,"PausedAt":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	l.R.Close()

	l2 := pauseLocal(t, be, dir)
	got, err := l2.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StatePaused || got.Pause == nil || !got.Pause.Released || got.Pause.AutoResume || !got.Pause.PausedAt.Equal(p.Pause.PausedAt) {
		t.Fatalf("re-adopted: %s %+v, want PAUSED as %+v", got.State, got.Pause, p.Pause)
	}
	if o, _ := l2.Get(ctx, other.ID); o.State != StateRunning || o.Pause != nil {
		t.Errorf("sandbox with a stale pause file: %s %+v, want RUNNING", o.State, o.Pause)
	}
	if _, err := os.Stat(l2.R.pausedPath(other.ID)); !os.IsNotExist(err) {
		t.Errorf("stale pause file: %v", err)
	}
	if err := exec(ctx, l2.R, sb.ID); !errors.Is(err, ErrPaused) {
		t.Errorf("exec: %v, want ErrPaused", err)
	}
	if _, err := l2.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	watched(t, be, l2.R, sb.ID, 2)
}

// TestFork: forks of a running and of a paused sandbox are new RUNNING sandboxes with
// the source's spec and the targets' IDs, Meta and share token; one the backend failed
// is FAILED ForkFailed with its error; the source keeps its state.
func TestFork(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	src := runningSandbox(t, l, map[string]string{runtime.MetaOrg: "org-a"}, time.Hour)
	be.forkFail["fork-bad"] = errors.New("restore failed: no space left")
	seen := make(chan []string, 16)
	go func() { // forks are listed while they are being made
		for range 3 {
			<-l.R.Changed()
			var ids []string
			for _, sb := range l.R.List() {
				ids = append(ids, sb.ID)
			}
			seen <- ids
		}
	}()
	res, err := l.Fork(ctx, src.ID, []ForkTarget{
		{ID: "fork-a", Meta: map[string]string{runtime.MetaOrg: "org-a", "k": "v"}, ShareTokenHash: "abc"},
		{ID: "fork-bad"},
		{ID: "fork-b", Lifetime: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d results", len(res))
	}
	a, bad, b := res[0], res[1], res[2]
	if a.Err != nil || a.Sandbox.State != StateRunning || a.Sandbox.ID != "fork-a" || a.Sandbox.Spec.ID != "fork-a" ||
		a.Sandbox.Spec.Meta[runtime.MetaForkedFrom] != src.ID || a.Sandbox.Spec.Meta["k"] != "v" || a.Sandbox.Spec.ShareTokenHash != "abc" ||
		a.Sandbox.Spec.Container.Image != "busybox" || a.Sandbox.Lifetime != src.Lifetime || a.Sandbox.IP != "192.0.2.10" {
		t.Errorf("fork a: %v %+v", a.Err, a.Sandbox)
	}
	if bad.Err == nil || !strings.Contains(bad.Err.Error(), "no space left") || bad.Sandbox.State != StateFailed || bad.Sandbox.Reason != ReasonForkFailed {
		t.Errorf("failed fork: %v %s %s", bad.Err, bad.Sandbox.State, bad.Sandbox.Reason)
	}
	if b.Err != nil || b.Sandbox.Lifetime != time.Minute || b.Sandbox.Spec.Meta[runtime.MetaLifetime] != "1m0s" {
		t.Errorf("fork b: %v lifetime %s", b.Err, b.Sandbox.Lifetime)
	}
	if ids := <-seen; !slices.Contains(ids, "fork-a") {
		t.Errorf("first change after the fork began lists %v, want the forks", ids)
	}
	if err := exec(ctx, l.R, "fork-a"); err != nil {
		t.Errorf("exec in a fork: %v", err)
	}
	watched(t, be, l.R, "fork-b", 4) // followed like any running sandbox
	if got, _ := l.Get(ctx, src.ID); got.State != StateRunning {
		t.Errorf("source: %s", got.State)
	}

	// From a paused source, which stays paused.
	if _, err := l.Pause(ctx, src.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err = l.Fork(ctx, src.ID, []ForkTarget{{ID: "fork-c"}})
	if err != nil || res[0].Err != nil || res[0].Sandbox.State != StateRunning {
		t.Fatalf("fork of a paused sandbox: %v %+v", err, res)
	}
	if got, _ := l.Get(ctx, src.ID); got.State != StatePaused {
		t.Errorf("paused source after the fork: %s", got.State)
	}
	if _, resumes, _ := be.counts(); resumes != 0 {
		t.Errorf("backend resumes %d", resumes)
	}

	// Refusals.
	var verr *ValidationError
	many := make([]ForkTarget, MaxForks+1)
	for i := range many {
		many[i].ID = fmt.Sprintf("f%d", i)
	}
	for name, ts := range map[string][]ForkTarget{
		"none":      nil,
		"too many":  many,
		"bad ID":    {{ID: "Not_A_Label"}},
		"duplicate": {{ID: "fork-d"}, {ID: "fork-d"}},
		"existing":  {{ID: "fork-a"}},
	} {
		if _, err := l.Fork(ctx, src.ID, ts); !errors.As(err, &verr) {
			t.Errorf("%s: %v, want a ValidationError", name, err)
		}
	}
	if _, err := l.Fork(ctx, "nope", []ForkTarget{{ID: "fork-e"}}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown source: %v", err)
	}
	if _, err := l.Fork(ctx, "fork-bad", []ForkTarget{{ID: "fork-e"}}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("ended source: %v", err)
	}
}

// TestPauseResumeDeleteConcurrently: pauses, resumes and a delete of one sandbox at once
// serialize: the sandbox ends TERMINATED, and every call returns a state it had.
func TestPauseResumeDeleteConcurrently(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				got Sandbox
				err error
			)
			if i%2 == 0 {
				got, err = l.Pause(ctx, sb.ID, PauseOptions{})
				if err == nil && got.State != StatePaused {
					t.Errorf("pause returned %s", got.State)
				}
			} else {
				got, err = l.Resume(ctx, sb.ID)
				if err == nil && got.State != StateRunning {
					t.Errorf("resume returned %s", got.State)
				}
			}
			if err != nil && !errors.Is(err, ErrNotRunning) {
				t.Errorf("call %d: %v", i, err)
			}
			if i == 10 {
				if _, err := l.Delete(ctx, sb.ID, time.Second); err != nil {
					t.Errorf("delete: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	got, err := l.R.WaitTerminal(ctx, sb.ID)
	if err != nil || got.State != StateTerminated {
		t.Fatalf("ended %s %v", got.State, err)
	}

	// A delete during a pause under way ends the sandbox; the pause reports it not running.
	sb = runningSandbox(t, l, nil, time.Hour)
	entered, release := make(chan struct{}), make(chan struct{})
	be.onPause = func(string) {
		close(entered)
		<-release
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Pause(ctx, sb.ID, PauseOptions{})
		errc <- err
	}()
	<-entered
	if d, err := l.Delete(ctx, sb.ID, time.Second); err != nil || d.State != StateTerminating {
		t.Fatalf("delete during a pause: %s %v", d.State, err)
	}
	close(release)
	if err := <-errc; !errors.Is(err, ErrNotRunning) {
		t.Errorf("pause overtaken by a delete: %v, want ErrNotRunning", err)
	}
	got, _ = l.R.WaitTerminal(ctx, sb.ID)
	if got.State != StateTerminated || got.Reason != ReasonDeleted {
		t.Errorf("ended %s %s", got.State, got.Reason)
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("RUNNER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestIdlePause: a sandbox with an idle time is paused (checkpointed) once it has had no
// exec, files or endpoint traffic for that long, not while a call or an endpoint
// request lasts; exec resumes it (auto-resume by default), and with auto-resume off it
// answers ErrPaused.
func TestIdlePause(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, map[string]string{runtime.MetaIdlePause: "300ms"}, time.Hour)
	plain := runningSandbox(t, l, nil, time.Hour)

	done, err := l.R.Wake(ctx, sb.ID) // an endpoint request that lasts
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Fatalf("busy with a request: %s, want RUNNING", got.State)
	}
	done()
	got := awaitState(t, l.R, sb.ID, StatePaused)
	if !got.Pause.Released || !got.Pause.AutoResume {
		t.Errorf("idle pause: %+v", got.Pause)
	}
	if err := exec(ctx, l.R, sb.ID); err != nil {
		t.Fatalf("exec after the idle pause: %v", err)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("after exec: %s, want RUNNING", got.State)
	}
	if got, _ := l.Get(ctx, plain.ID); got.State != StateRunning {
		t.Errorf("sandbox without an idle time: %s", got.State)
	}

	// A stream keeps it busy until its context ends.
	sctx, cancel := context.WithCancel(ctx)
	a, err := l.R.Agent(sctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	_ = a.StreamExec(sctx)
	time.Sleep(600 * time.Millisecond)
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Fatalf("busy with a stream: %s, want RUNNING", got.State)
	}
	cancel()
	awaitState(t, l.R, sb.ID, StatePaused)

	off := runningSandbox(t, l, map[string]string{runtime.MetaIdlePause: "100ms", runtime.MetaAutoResume: "false"}, time.Hour)
	awaitState(t, l.R, off.ID, StatePaused)
	if err := exec(ctx, l.R, off.ID); !errors.Is(err, ErrPaused) {
		t.Errorf("exec with auto-resume off: %v, want ErrPaused", err)
	}
	if _, err := l.R.Wake(ctx, off.ID); !errors.Is(err, ErrPaused) {
		t.Errorf("endpoint traffic with auto-resume off: %v, want ErrPaused", err)
	}
}

// TestWakeResumes: endpoint traffic to a paused sandbox with auto-resume resumes it.
func TestWakeResumes(t *testing.T) {
	be := newPauseFake(checkpointing)
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	done, err := l.R.Wake(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
		t.Errorf("after endpoint traffic: %s, want RUNNING", got.State)
	}
	if _, err := l.R.Wake(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
}

// logPauseFake is a pauseFake that keeps the primary's log under root/primary, opened
// as the local backend opens a log its agent left (runtime.ContainerLogOpener).
type logPauseFake struct {
	*pauseFake
	root string
}

func (b *logPauseFake) OpenContainerLog(_, container string) (*logstore.Reader, error) {
	if container != "" {
		return nil, fmt.Errorf("%w: no log of %q", errors.ErrUnsupported, container)
	}
	return logstore.OpenReaderBeneath(b.root, "primary", "main")
}

// TestPausedLogsReadWhereTheAgentLeftThem: the log of a paused sandbox is read from
// what its agent wrote, without resuming it.
func TestPausedLogsReadWhereTheAgentLeftThem(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "primary"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeLog(t, filepath.Join(root, "primary"), "before the pause\n")
	be := &logPauseFake{pauseFake: newPauseFake(checkpointing), root: root}
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{AutoResume: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(t, l.R, sb.ID, ""); err != nil || got != "before the pause\n" {
		t.Errorf("log of a paused sandbox: %q %v", got, err)
	}
	if got, _ := l.Get(ctx, sb.ID); got.State != StatePaused {
		t.Errorf("after logs: %s, want PAUSED", got.State)
	}
	if _, resumes, _ := be.counts(); resumes != 0 {
		t.Errorf("backend resumes %d", resumes)
	}
}

// TestHeldLifetimeAcrossRestart: a paused sandbox whose lifetime is held outlives its
// deadline across a runner restart, and its resume moves the deadline on by the whole
// time paused, the runner's downtime included.
func TestHeldLifetimeAcrossRestart(t *testing.T) {
	be := newPauseFake(checkpointing)
	t.Cleanup(be.Close)
	dir := t.TempDir()
	l := pauseLocal(t, be, dir)
	ctx := context.Background()
	sb := runningSandbox(t, l, map[string]string{runtime.MetaPauseLifetime: "held"}, 300*time.Millisecond)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	l.R.Close()
	time.Sleep(400 * time.Millisecond) // the runner is down past the deadline
	l2 := pauseLocal(t, be, dir)
	time.Sleep(100 * time.Millisecond)
	got, _ := l2.Get(ctx, sb.ID)
	if got.State != StatePaused || got.Pause == nil || !got.Pause.LifetimeHeld {
		t.Fatalf("re-adopted: %s %+v, want PAUSED with the lifetime held", got.State, got.Pause)
	}
	res, err := l2.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lifetime < 800*time.Millisecond || time.Until(res.Deadline) <= 0 {
		t.Errorf("resumed: lifetime %s, deadline in %s", res.Lifetime, time.Until(res.Deadline))
	}
}
