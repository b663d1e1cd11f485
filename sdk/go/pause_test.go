package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
)

// stateServer fakes SandboxStateService (and GetSandbox) over a map of sandbox states:
// it records the requests and answers as the gateway documents (runc sandboxes refuse
// a release and forks).
type stateServer struct {
	statev1connect.UnimplementedSandboxStateServiceHandler
	sandboxv1connect.UnimplementedSandboxServiceHandler

	mu      sync.Mutex
	states  map[string]sandboxv1.State
	runc    map[string]bool
	pauses  []*statev1.PauseSandboxRequest
	resumes []string
	// resumeReqs are the ResumeSandbox requests; every sandbox runs on "r1" until a
	// resume with runner_ids not listing r1 moves it to the first one listed.
	resumeReqs []*statev1.ResumeSandboxRequest
	runners    map[string]string
	forks      []*statev1.ForkSandboxRequest
	auth       []string
	// forkErrs are returned by the next ForkSandbox calls, in order; failFork makes the
	// fork with this index (0-based) fail with UNAVAILABLE.
	forkErrs []error
	failFork int
	// forked counts forks per request ID (a repeated request returns the same ones).
	byRequest map[string][]*statev1.Fork
	next      int
}

func (s *stateServer) GetSandbox(_ context.Context, req *connect.Request[sandboxv1.GetSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.states[req.Msg.GetSandboxId()]
	if !ok {
		return nil, apiError(connect.CodeNotFound, ReasonSandboxNotFound, nil)
	}
	return connect.NewResponse(&sandboxv1.Sandbox{SandboxId: req.Msg.GetSandboxId(), Status: &sandboxv1.SandboxStatus{State: st}}), nil
}

func (s *stateServer) PauseSandbox(_ context.Context, req *connect.Request[statev1.PauseSandboxRequest]) (*connect.Response[statev1.PauseSandboxResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.auth = append(s.auth, req.Header().Get("Authorization"))
	s.pauses = append(s.pauses, proto.Clone(req.Msg).(*statev1.PauseSandboxRequest))
	id := req.Msg.GetSandboxId()
	st, ok := s.states[id]
	switch {
	case !ok:
		return nil, apiError(connect.CodeNotFound, ReasonSandboxNotFound, nil)
	case st != sandboxv1.State_STATE_RUNNING:
		return nil, apiError(connect.CodeFailedPrecondition, ReasonSandboxNotRunning, nil)
	case s.runc[id] && req.Msg.GetReleaseResources():
		return nil, apiError(connect.CodeFailedPrecondition, ReasonCheckpointNotSupported, nil)
	}
	s.states[id] = sandboxv1.State_STATE_PAUSED
	release := !s.runc[id] && (req.Msg.ReleaseResources == nil || req.Msg.GetReleaseResources())
	ps := &statev1.PauseStatus{SandboxId: id, ResourcesReleased: release, AutoResume: req.Msg.AutoResume == nil || req.Msg.GetAutoResume(),
		PausedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	if release {
		ps.CheckpointBytes = 4096
	}
	return connect.NewResponse(&statev1.PauseSandboxResponse{Status: ps}), nil
}

func (s *stateServer) ResumeSandbox(_ context.Context, req *connect.Request[statev1.ResumeSandboxRequest]) (*connect.Response[statev1.ResumeSandboxResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.Msg.GetSandboxId()
	s.resumes = append(s.resumes, id)
	s.resumeReqs = append(s.resumeReqs, proto.Clone(req.Msg).(*statev1.ResumeSandboxRequest))
	st, ok := s.states[id]
	switch {
	case !ok:
		return nil, apiError(connect.CodeNotFound, ReasonSandboxNotFound, nil)
	case st != sandboxv1.State_STATE_PAUSED && st != sandboxv1.State_STATE_RUNNING:
		return nil, apiError(connect.CodeFailedPrecondition, ReasonSandboxNotRunning, nil)
	}
	s.states[id] = sandboxv1.State_STATE_RUNNING
	res := &statev1.ResumeSandboxResponse{SandboxId: id, Deadline: timestamppb.New(time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)), RunnerId: s.runnerOf(id)}
	if ids := req.Msg.GetRunnerIds(); len(ids) > 0 && !slices.Contains(ids, res.RunnerId) {
		res.MovedFrom, res.RunnerId = res.RunnerId, ids[0]
		s.runners[id] = ids[0]
	}
	return connect.NewResponse(res), nil
}

// runnerOf is the runner sandbox id runs on (r1 unless moved).
func (s *stateServer) runnerOf(id string) string {
	if r, ok := s.runners[id]; ok {
		return r
	}
	return "r1"
}

func (s *stateServer) ForkSandbox(_ context.Context, req *connect.Request[statev1.ForkSandboxRequest]) (*connect.Response[statev1.ForkSandboxResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forks = append(s.forks, proto.Clone(req.Msg).(*statev1.ForkSandboxRequest))
	if len(s.forkErrs) > 0 {
		err := s.forkErrs[0]
		s.forkErrs = s.forkErrs[1:]
		return nil, err
	}
	id := req.Msg.GetSandboxId()
	if _, ok := s.states[id]; !ok {
		return nil, apiError(connect.CodeNotFound, ReasonSandboxNotFound, nil)
	}
	if s.runc[id] {
		return nil, apiError(connect.CodeFailedPrecondition, ReasonCheckpointNotSupported, nil)
	}
	if f, ok := s.byRequest[req.Msg.GetRequestId()]; ok {
		return connect.NewResponse(&statev1.ForkSandboxResponse{Forks: f}), nil
	}
	var out []*statev1.Fork
	for i := range int(max(req.Msg.GetCount(), 1)) {
		s.next++
		f := &statev1.Fork{SandboxId: fmt.Sprintf("fork-%d", s.next), RunnerId: s.runnerOf(id), EndpointShareToken: fmt.Sprintf("tok-%d", s.next)}
		if ids := req.Msg.GetRunnerIds(); len(ids) > 0 {
			f.RunnerId = ids[i%len(ids)]
		}
		if i == s.failFork {
			f.Error = &statev1.ForkError{Code: "UNAVAILABLE", Reason: ReasonRunnerUnavailable, Message: "runner gone"}
		} else {
			s.states[f.SandboxId] = sandboxv1.State_STATE_RUNNING
		}
		out = append(out, f)
	}
	s.byRequest[req.Msg.GetRequestId()] = out
	return connect.NewResponse(&statev1.ForkSandboxResponse{Forks: out}), nil
}

func newStateServer(t *testing.T) (*stateServer, *Client) {
	t.Helper()
	s := &stateServer{states: map[string]sandboxv1.State{}, runc: map[string]bool{}, byRequest: map[string][]*statev1.Fork{}, failFork: -1,
		runners: map[string]string{}}
	mux := http.NewServeMux()
	mux.Handle(statev1connect.NewSandboxStateServiceHandler(s))
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(s))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New("http://"+ln.Addr().String(), "k", WithDataPlane(DataPlaneGateway))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestSDKPauseResume(t *testing.T) {
	srv, c := newStateServer(t)
	ctx := context.Background()
	srv.states["sb-1"] = sandboxv1.State_STATE_RUNNING
	sb, err := c.Get(ctx, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	f := false
	ps, err := sb.Pause(ctx, PauseOptions{AutoResume: &f})
	if err != nil {
		t.Fatal(err)
	}
	want := PauseStatus{ID: "sb-1", ResourcesReleased: true, CheckpointBytes: 4096, PausedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if ps != want {
		t.Errorf("pause status %+v, want %+v", ps, want)
	}
	if sb.State() != StatePaused {
		t.Errorf("handle state after Pause: %s", sb.State())
	}
	if r := srv.pauses[0]; r.ReleaseResources != nil || r.AutoResume == nil || r.GetAutoResume() || srv.auth[0] != "Bearer k" {
		t.Errorf("pause request %v, auth %q", r, srv.auth[0])
	}

	// A paused sandbox is neither terminal nor a reason for Wait to fail or to wait on.
	if StatePaused.Terminal() {
		t.Error("PAUSED is terminal")
	}
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sb.Wait(waitCtx); err != nil || sb.State() != StatePaused {
		t.Errorf("Wait on a paused sandbox: %v (state %s)", err, sb.State())
	}
	if st, err := ParseState("paused"); err != nil || st != StatePaused || StatePaused.String() != "paused" {
		t.Errorf("ParseState(paused) = %v, %v; String %q", st, err, StatePaused.String())
	}

	// Pausing again: not running.
	if _, err := c.Pause(ctx, "sb-1", PauseOptions{}); !errors.Is(err, ErrNotRunning) || ReasonOf(err) != ReasonSandboxNotRunning {
		t.Errorf("second pause: %v", err)
	}
	deadline, err := sb.Resume(ctx)
	if err != nil || !deadline.Equal(time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)) || sb.State() != StateRunning {
		t.Errorf("resume: %v %v, state %s", deadline, err, sb.State())
	}
	if _, err := c.Resume(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("resume of an unknown sandbox: %v", err)
	}

	// runc: a freeze, and a release refused.
	srv.states["runc-1"] = sandboxv1.State_STATE_RUNNING
	srv.runc["runc-1"] = true
	tr := true
	_, err = c.Pause(ctx, "runc-1", PauseOptions{ReleaseResources: &tr})
	if !errors.Is(err, ErrCheckpointNotSupported) || errors.Is(err, ErrNotRunning) {
		t.Errorf("release on runc: %v", err)
	}
	ps, err = c.Pause(ctx, "runc-1", PauseOptions{})
	if err != nil || ps.ResourcesReleased || ps.CheckpointBytes != 0 || !ps.AutoResume {
		t.Errorf("freeze on runc: %+v %v", ps, err)
	}
	if p := srv.pauses[len(srv.pauses)-1]; p.ReleaseResources != nil || p.AutoResume != nil {
		t.Errorf("unset options were sent: %v", p)
	}
}

func TestSDKFork(t *testing.T) {
	srv, c := newStateServer(t)
	ctx := context.Background()
	srv.states["sb-1"] = sandboxv1.State_STATE_RUNNING
	forks, err := c.Sandbox("sb-1").Fork(ctx, 3, ForkOptions{RequestID: "r-1"})
	if err != nil || len(forks) != 3 || forks[0].ID() != "fork-1" || forks[2].ID() != "fork-3" {
		t.Fatalf("fork ×3: %v %v", forks, err)
	}
	if r := srv.forks[0]; r.GetCount() != 3 || r.GetRequestId() != "r-1" || r.GetSandboxId() != "sb-1" || len(r.GetRunnerIds()) != 0 {
		t.Errorf("fork request %v", r)
	}
	if in := forks[1].Info(); in.RunnerID != "r1" || in.ID != "fork-2" || forks[1].ShareToken() != "tok-2" {
		t.Errorf("fork handle: %+v, token %q", in, forks[1].ShareToken())
	}
	// The same request ID: the same forks.
	again, err := c.Fork(ctx, "sb-1", 3, ForkOptions{RequestID: "r-1"})
	if err != nil || len(again) != 3 || again[0].ID() != "fork-1" {
		t.Errorf("repeated fork: %v %v", again, err)
	}

	// A transient failure is retried with the same (generated) request ID.
	srv.forkErrs = []error{apiError(connect.CodeUnavailable, ReasonRunnerUnavailable, nil)}
	forks, err = c.Fork(ctx, "sb-1", 1, ForkOptions{})
	if err != nil || len(forks) != 1 {
		t.Fatalf("fork after a transient failure: %v %v", forks, err)
	}
	n := len(srv.forks)
	if id := srv.forks[n-1].GetRequestId(); id == "" || id != srv.forks[n-2].GetRequestId() {
		t.Errorf("retry request IDs %q, %q", srv.forks[n-2].GetRequestId(), id)
	}

	// One fork of three fails: the others come back with a *PartialForkError.
	srv.failFork = 1
	forks, err = c.Fork(ctx, "sb-1", 3, ForkOptions{})
	var pe *PartialForkError
	var fe *ForkError
	if len(forks) != 2 || !errors.As(err, &pe) || len(pe.Failed) != 1 || !errors.As(err, &fe) {
		t.Fatalf("partial fork: %v %v", forks, err)
	}
	if fe.ID != "fork-6" || fe.Err.Code != connect.CodeUnavailable || fe.Err.Reason != ReasonRunnerUnavailable || !errors.Is(err, ErrUnavailable) {
		t.Errorf("fork error %+v (%v)", fe, fe.Err)
	}

	// runc: refused; counts out of range never reach the server.
	srv.states["runc-1"] = sandboxv1.State_STATE_RUNNING
	srv.runc["runc-1"] = true
	if _, err := c.Fork(ctx, "runc-1", 1, ForkOptions{}); !errors.Is(err, ErrCheckpointNotSupported) {
		t.Errorf("fork on runc: %v", err)
	}
	calls := len(srv.forks)
	for _, bad := range []int{0, -1, MaxForks + 1} {
		if _, err := c.Fork(ctx, "sb-1", bad, ForkOptions{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("fork ×%d: %v", bad, err)
		}
	}
	if len(srv.forks) != calls {
		t.Error("a bad fork count reached the server")
	}
}

func TestSDKResumeAndForkOnRunners(t *testing.T) {
	srv, c := newStateServer(t)
	ctx := context.Background()
	srv.states["sb-1"] = sandboxv1.State_STATE_PAUSED

	// Resume where it is: its runner, not moved; no runner_ids sent.
	sb := c.Sandbox("sb-1")
	res, err := sb.ResumeWith(ctx, ResumeOptions{})
	if err != nil || res.ID != "sb-1" || res.RunnerID != "r1" || res.MovedFrom != "" || res.Deadline.IsZero() {
		t.Fatalf("resume: %+v %v", res, err)
	}
	if r := srv.resumeReqs[0]; len(r.GetRunnerIds()) != 0 {
		t.Errorf("runner_ids sent without RunnerIDs: %v", r)
	}
	if in := sb.Info(); in.State != StateRunning || in.RunnerID != "r1" {
		t.Errorf("handle after resume: %+v", in)
	}

	// Resume elsewhere: runner_ids sent, the new runner and where from returned, and
	// the handle knows its new runner.
	srv.states["sb-1"] = sandboxv1.State_STATE_PAUSED
	res, err = sb.ResumeWith(ctx, ResumeOptions{RunnerIDs: []string{"r2", "r3"}})
	if err != nil || res.RunnerID != "r2" || res.MovedFrom != "r1" {
		t.Fatalf("resume on r2: %+v %v", res, err)
	}
	if r := srv.resumeReqs[1]; !slices.Equal(r.GetRunnerIds(), []string{"r2", "r3"}) || r.GetSandboxId() != "sb-1" {
		t.Errorf("resume request %v", r)
	}
	if in := sb.Info(); in.State != StateRunning || in.RunnerID != "r2" {
		t.Errorf("handle after the move: %+v", in)
	}
	if _, err := c.ResumeWith(ctx, "nope", ResumeOptions{RunnerIDs: []string{"r2"}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("resume of an unknown sandbox: %v", err)
	}

	// Fork onto other runners: runner_ids sent, each fork's runner on its handle.
	forks, err := c.Fork(ctx, "sb-1", 2, ForkOptions{RunnerIDs: []string{"r3", "r4"}})
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork on r3, r4: %v %v", forks, err)
	}
	if r := srv.forks[0]; !slices.Equal(r.GetRunnerIds(), []string{"r3", "r4"}) || r.GetCount() != 2 {
		t.Errorf("fork request %v", r)
	}
	if forks[0].Info().RunnerID != "r3" || forks[1].Info().RunnerID != "r4" {
		t.Errorf("fork runners %q, %q", forks[0].Info().RunnerID, forks[1].Info().RunnerID)
	}
}

func TestSDKForkAPIError(t *testing.T) {
	for _, tc := range []struct {
		code string
		want connect.Code
	}{{"UNAVAILABLE", connect.CodeUnavailable}, {"FAILED_PRECONDITION", connect.CodeFailedPrecondition}, {"CANCELLED", connect.CodeCanceled}, {"bogus", connect.CodeUnknown}, {"", connect.CodeUnknown}} {
		if e := forkAPIError(&statev1.ForkError{Code: tc.code, Reason: "R", Message: "m"}); e.Code != tc.want || e.Reason != "R" || e.Message != "m" {
			t.Errorf("%q: %+v", tc.code, e)
		}
	}
}

// TestSDKCheckpointSpaceNotRetried: a full checkpoint store (RESOURCE_EXHAUSTED
// CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED) is ErrResourceExhausted and no failure a Fork's
// retries wait out (it lifts when checkpoints are deleted, not by waiting).
func TestSDKCheckpointSpaceNotRetried(t *testing.T) {
	err := fromRPC(apiError(connect.CodeResourceExhausted, ReasonCheckpointSpaceExhausted, nil))
	if !errors.Is(err, ErrResourceExhausted) || isRetryable(err) {
		t.Errorf("%v: ErrResourceExhausted %v, retryable %v", err, errors.Is(err, ErrResourceExhausted), isRetryable(err))
	}
}
