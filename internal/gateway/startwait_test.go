package gateway

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// awaitingRunner is an acceptingRunner that can wait in AwaitStart: each call says it
// waits (on waiting), then answers once the test starts the sandbox (start) or the
// caller gives up.
type awaitingRunner struct {
	acceptingRunner
	waiting chan time.Duration // the wait of each AwaitStart, once it waits
	started chan struct{}      // closed by start
}

func newAwaitingRunner() *awaitingRunner {
	return &awaitingRunner{acceptingRunner: acceptingRunner{id: "r1"}, waiting: make(chan time.Duration, 16), started: make(chan struct{})}
}

func (r *awaitingRunner) AwaitStart(ctx context.Context, id string, wait time.Duration) (runner.Sandbox, error) {
	r.waiting <- wait
	select {
	case <-r.started:
	case <-ctx.Done():
	}
	return r.Get(ctx, id)
}

// start has every sandbox run and wakes the waiting calls.
func (r *awaitingRunner) start() {
	r.mu.Lock()
	for id, sb := range r.got {
		sb.State = runner.StateRunning
		r.got[id] = sb
	}
	r.mu.Unlock()
	close(r.started)
}

func getState(ctx context.Context, t *testing.T, s *Server, id string) sandboxv1.State {
	t.Helper()
	res, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetStatus().GetState()
}

func createOne(t *testing.T, s *Server) string {
	t.Helper()
	res, err := s.CreateSandbox(asOrg(t.Context()), connect.NewRequest(endpointSpec()))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetSandboxId()
}

// TestGetSandboxWaitsForStart: a GetSandbox of a young CREATING sandbox waits (bounded:
// at most StartWaitOptions.Max and half the caller's deadline) and answers RUNNING once
// the sandbox runs.
func TestGetSandboxWaitsForStart(t *testing.T) {
	r := newAwaitingRunner()
	s := newTestGateway(t, t.TempDir(), r)
	id := createOne(t, s)
	ctx, cancel := context.WithTimeout(asOrg(t.Context()), time.Minute)
	defer cancel()
	got := make(chan sandboxv1.State, 1)
	go func() { got <- getState(ctx, t, s, id) }()
	if w := <-r.waiting; w <= 0 || w > DefaultStartWait {
		t.Errorf("asked the runner to wait %v, want (0, %v]", w, DefaultStartWait)
	}
	r.start()
	if st := <-got; st != sandboxv1.State_STATE_RUNNING {
		t.Errorf("waiting GetSandbox answered %v, want RUNNING", st)
	}
	// A running sandbox is answered at once, without a wait.
	if st := getState(ctx, t, s, id); st != sandboxv1.State_STATE_RUNNING || len(r.waiting) != 0 {
		t.Errorf("GetSandbox of a running sandbox: %v (%d waits), want RUNNING without one", st, len(r.waiting))
	}
}

// TestGetSandboxWaitBounded: beyond the organization's waiters a GetSandbox answers at
// once with the current state; a cancelled caller ends its wait and frees its place; a
// deadline too short to wait in answers at once.
func TestGetSandboxWaitBounded(t *testing.T) {
	r := newAwaitingRunner()
	s := newTestGateway(t, t.TempDir(), r)
	s.startWaiters = newOrgSlots(DefaultStartWaiters, 1)
	id := createOne(t, s)
	ctx, cancel := context.WithCancel(asOrg(t.Context()))
	first := make(chan sandboxv1.State, 1)
	go func() {
		res, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Error(err)
			first <- sandboxv1.State_STATE_UNSPECIFIED
			return
		}
		first <- res.Msg.GetStatus().GetState()
	}()
	<-r.waiting // the first call holds the organization's only place
	if st := getState(asOrg(t.Context()), t, s, id); st != sandboxv1.State_STATE_CREATING || len(r.waiting) != 0 {
		t.Errorf("beyond the cap: %v (%d waits), want CREATING at once", st, len(r.waiting))
	}
	cancel()
	if st := <-first; st != sandboxv1.State_STATE_CREATING {
		t.Errorf("cancelled wait answered %v, want CREATING", st)
	}
	// Its place is free again: the next call waits.
	ctx2, cancel2 := context.WithTimeout(asOrg(t.Context()), time.Minute)
	defer cancel2()
	second := make(chan sandboxv1.State, 1)
	go func() { second <- getState(ctx2, t, s, id) }()
	<-r.waiting
	r.start()
	if st := <-second; st != sandboxv1.State_STATE_RUNNING {
		t.Errorf("after the cancelled wait: %v, want RUNNING", st)
	}
}

// TestOrgSlotsCaps: the gateway's and each organization's places.
func TestOrgSlotsCaps(t *testing.T) {
	w := (StartWaitOptions{MaxWaiters: 2, MaxWaitersPerOrg: 1}).withDefaults().slots()
	if !w.acquire("a") || w.acquire("a") {
		t.Fatal("organization a: want one place")
	}
	if !w.acquire("b") {
		t.Fatal("organization b: want its place")
	}
	if w.acquire("c") {
		t.Fatal("organization c: the gateway's places are taken")
	}
	w.release("a")
	if !w.acquire("c") {
		t.Fatal("organization c after a released: want a place")
	}
	w.release("b")
	w.release("c")
	if n := w.held(); n != 0 {
		t.Errorf("%d places held after every release", n)
	}
}

// TestStartWaitBounds: how long one call waits.
func TestStartWaitBounds(t *testing.T) {
	if (StartWaitOptions{Max: -1}).withDefaults().wait(context.Background()) != 0 {
		t.Error("a negative Max waits")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if d := (StartWaitOptions{}).withDefaults().wait(ctx); d > 50*time.Millisecond {
		t.Errorf("wait under a 100ms deadline: %v, want at most half of it", d)
	}
	if err := (StartWaitOptions{Max: time.Minute}).Validate(); err == nil {
		t.Error("a wait of a minute is valid")
	}
}
