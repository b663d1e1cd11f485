package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// pauseRunner is an acceptingRunner that pauses, resumes and forks (runner.PauseHandle)
// as the contract says, keeping what it was asked.
type pauseRunner struct {
	*acceptingRunner
	// noCheckpoint: a runtime class that can only freeze (runc without CRIU).
	noCheckpoint bool
	// maxSandboxes is its capacity's MaxSandboxes.
	maxSandboxes int
	// forkErrs fails the forks of these IDs' positions (by target index).
	forkErrs map[int]error
	pauses   []runner.PauseOptions
	forks    [][]runner.ForkTarget
	agents   []string // sandboxes Agent was asked for
}

var _ runner.PauseHandle = (*pauseRunner)(nil)

func newPauseRunner(id string) *pauseRunner {
	return &pauseRunner{acceptingRunner: &acceptingRunner{id: id, shareTokens: true}}
}

func (r *pauseRunner) setState(id string, st runner.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.got[id]
	sb.State = st
	if st.Terminal() {
		sb.EndedAt = time.Now()
	}
	r.got[id] = sb
}

func (r *pauseRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	c, _ := r.acceptingRunner.Capacity(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	c.MaxSandboxes = r.maxSandboxes
	for _, sb := range r.got {
		if !sb.State.Terminal() {
			c.Running++
		}
	}
	return c, nil
}

func (r *pauseRunner) Pause(_ context.Context, id string, opts runner.PauseOptions) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pauses = append(r.pauses, opts)
	sb, ok := r.got[id]
	switch {
	case !ok:
		return runner.Sandbox{}, runtime.ErrNotFound
	case sb.State == runner.StatePaused:
		return runner.Sandbox{}, runner.ErrAlreadyPaused
	case sb.State != runner.StateRunning:
		return runner.Sandbox{}, runner.ErrNotRunning
	}
	release := opts.Release == nil || *opts.Release
	if r.noCheckpoint {
		if opts.Release != nil && *opts.Release {
			return runner.Sandbox{}, fmt.Errorf("%w: runtime class runc has no checkpoints on this runner; gvisor has", runner.ErrCannotCheckpoint)
		}
		release = false
	}
	sb.State = runner.StatePaused
	sb.Pause = &runner.PauseStatus{Released: release, AutoResume: opts.AutoResume, LifetimeHeld: sb.Spec.Meta[runtime.MetaPauseLifetime] == "held",
		PausedAt: time.Now()}
	if release {
		sb.Pause.CheckpointBytes = 416 << 10
	}
	r.got[id] = sb
	return sb, nil
}

func (r *pauseRunner) Resume(_ context.Context, id string) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.got[id]
	switch {
	case !ok:
		return runner.Sandbox{}, runtime.ErrNotFound
	case sb.State == runner.StateRunning:
		return sb, nil
	case sb.State != runner.StatePaused:
		return runner.Sandbox{}, runner.ErrNotRunning
	}
	sb.State, sb.Pause, sb.Deadline = runner.StateRunning, nil, time.Now().Add(time.Hour)
	r.got[id] = sb
	return sb, nil
}

func (r *pauseRunner) Fork(_ context.Context, id string, targets []runner.ForkTarget) ([]runner.ForkResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forks = append(r.forks, targets)
	src, ok := r.got[id]
	switch {
	case !ok:
		return nil, runtime.ErrNotFound
	case src.State != runner.StateRunning && src.State != runner.StatePaused:
		return nil, runner.ErrNotRunning
	case r.noCheckpoint:
		return nil, fmt.Errorf("%w: runtime class runc cannot be forked on this runner; gvisor can", runner.ErrCannotCheckpoint)
	}
	out := make([]runner.ForkResult, len(targets))
	for i, t := range targets {
		if err := r.forkErrs[i]; err != nil {
			out[i].Err = err
			continue
		}
		sp := src.Spec
		sp.ID, sp.ShareTokenHash = t.ID, t.ShareTokenHash
		sp.Meta = maps.Clone(t.Meta)
		sp.Meta[runtime.MetaForkedFrom] = id
		sb := runner.Sandbox{ID: t.ID, Spec: sp, State: runner.StateRunning, CreatedAt: time.Now(), Lifetime: src.Lifetime}
		r.got[t.ID] = sb
		out[i].Sandbox = sb
	}
	return out, nil
}

// Agent resumes a paused sandbox whose pause has auto-resume on, and answers
// runner.ErrPaused for one without (as the runner does); this fake has no agent.
func (r *pauseRunner) Agent(_ context.Context, id, _ string) (agentv1connect.AgentServiceClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.agents = append(r.agents, id)
	sb := r.got[id]
	if sb.State == runner.StatePaused {
		if !sb.Pause.AutoResume {
			return nil, runner.ErrPaused
		}
		sb.State, sb.Pause = runner.StateRunning, nil
		r.got[id] = sb
	}
	return nil, errors.New("this fake runner has no agent")
}

// pauseEnv is a gateway over runners with a store-backed index, served over HTTP, and
// keys of two organizations.
type pauseEnv struct {
	s           *Server
	url         string
	acme, other string // API keys
	acmeKeyID   string
	sc          sandboxv1connect.SandboxServiceClient
	pc          statev1connect.SandboxStateServiceClient
	st          store.Store
	keys        *auth.Keyring
}

func newPauseEnv(t *testing.T, policyDoc string, runners ...runner.Handle) *pauseEnv {
	t.Helper()
	dir := t.TempDir()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := &pauseEnv{st: st, keys: keys}
	for _, org := range []string{"acme", "other"} {
		if _, err := st.Orgs().Create(ctx, store.Org{ID: org, Name: org}); err != nil {
			t.Fatal(err)
		}
		key, p, err := keys.Create(org, auth.RoleUser, org)
		if err != nil {
			t.Fatal(err)
		}
		if org == "acme" {
			e.acme, e.acmeKeyID = key, p.KeyID
		} else {
			e.other = key
		}
	}
	cfg := Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Logger: slog.New(slog.DiscardHandler)}
	if policyDoc != "" {
		cfg.Policies = staticPolicy(policyDoc)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	e.s, e.url = s, srv.URL
	e.sc = sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL)
	e.pc = statev1connect.NewSandboxStateServiceClient(http.DefaultClient, srv.URL)
	return e
}

func withKey[T any](key string, m *T) *connect.Request[T] {
	req := connect.NewRequest(m)
	req.Header().Set("Authorization", "Bearer "+key)
	return req
}

func (e *pauseEnv) create(t *testing.T, services ...*sandboxv1.Service) string {
	t.Helper()
	req := endpointSpec(services...)
	req.Sandbox.Spec.Containers[0].Resources = &sandboxv1.Resources{Cpu: "500m", Memory: "256Mi"}
	req.Sandbox.DisplayName = "acme's sandbox"
	res, err := e.sc.CreateSandbox(t.Context(), withKey(e.acme, req))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetSandboxId()
}

func (e *pauseEnv) get(t *testing.T, id string) *sandboxv1.Sandbox {
	t.Helper()
	res, err := e.sc.GetSandbox(t.Context(), withKey(e.acme, &sandboxv1.GetSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg
}

func (e *pauseEnv) rest(t *testing.T, key, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func wantAPIError(t *testing.T, what string, err error, code connect.Code, reason, field string) {
	t.Helper()
	if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Errorf("%s: %v, want %s %s", what, err, code, reason)
		return
	}
	if field != "" {
		vs := apierr.Violations(err)
		if len(vs) != 1 || vs[0].Field != field {
			t.Errorf("%s: violations %v, want one on %s", what, vs, field)
		}
	}
}

// TestPauseResume: over the gateway's Connect and REST handlers with a fake runner:
// pause shows PAUSED in Get and List (and List's state filter), auto_resume unset takes
// the sandbox's own setting, a second pause and another organization's sandbox are
// refused, resume shows RUNNING again, and a checkpoint the runtime class cannot make
// is FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED.
func TestPauseResume(t *testing.T) {
	r := newPauseRunner("r1")
	e := newPauseEnv(t, "", r)
	ctx := t.Context()
	id := e.create(t)
	r.setState(id, runner.StateRunning)

	res, err := e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	st := res.Msg.GetStatus()
	if st.GetSandboxId() != id || !st.GetResourcesReleased() || !st.GetAutoResume() || st.GetLifetimeHeld() || st.GetPausedAt() == nil || st.GetCheckpointBytes() == 0 {
		t.Errorf("pause status %v", st)
	}
	if got := r.pauses[0]; got.Release != nil || !got.AutoResume {
		t.Errorf("runner asked %+v, want release unset and auto-resume on (the default)", got)
	}
	sb := e.get(t, id)
	if sb.GetStatus().GetState() != sandboxv1.State_STATE_PAUSED || sb.GetStatus().GetContainerStatuses()[0].GetState() != sandboxv1.State_STATE_PAUSED {
		t.Errorf("GetSandbox of a paused sandbox: %v", sb.GetStatus())
	}
	list := func(state sandboxv1.State) []string {
		t.Helper()
		res, err := e.sc.ListSandboxes(ctx, withKey(e.acme, &sandboxv1.ListSandboxesRequest{State: state}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sb := range res.Msg.GetSandboxes() {
			out = append(out, sb.GetSandboxId()+"="+sb.GetStatus().GetState().String())
		}
		return out
	}
	if got := list(sandboxv1.State_STATE_UNSPECIFIED); !slices.Equal(got, []string{id + "=STATE_PAUSED"}) {
		t.Errorf("List: %v", got)
	}
	if got := list(sandboxv1.State_STATE_PAUSED); len(got) != 1 {
		t.Errorf("List state=PAUSED: %v", got)
	}
	if got := list(sandboxv1.State_STATE_RUNNING); len(got) != 0 {
		t.Errorf("List state=RUNNING: %v", got)
	}

	_, err = e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id}))
	wantAPIError(t, "pause a paused sandbox", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "")
	_, err = e.pc.PauseSandbox(ctx, withKey(e.other, &statev1.PauseSandboxRequest{SandboxId: id}))
	wantAPIError(t, "pause another organization's", err, connect.CodeNotFound, apierr.SandboxNotFound, "")
	_, err = e.pc.ResumeSandbox(ctx, withKey(e.other, &statev1.ResumeSandboxRequest{SandboxId: id}))
	wantAPIError(t, "resume another organization's", err, connect.CodeNotFound, apierr.SandboxNotFound, "")
	_, err = e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{}))
	wantAPIError(t, "no sandbox_id", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_id")
	if _, err := e.pc.PauseSandbox(ctx, withKey("nope", &statev1.PauseSandboxRequest{SandboxId: id})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("without a valid key: %v", err)
	}

	rres, err := e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if rres.Msg.GetSandboxId() != id || rres.Msg.GetDeadline() == nil {
		t.Errorf("resume: %v", rres.Msg)
	}
	if got := e.get(t, id).GetStatus().GetState(); got != sandboxv1.State_STATE_RUNNING {
		t.Errorf("after resume: %v", got)
	}
	if _, err := e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id})); err != nil {
		t.Errorf("resume a running sandbox: %v, want it returned as it is", err)
	}

	// REST, per the google.api.http annotations.
	code, body := e.rest(t, e.acme, "/v1/sandboxes/"+id+":pause", `{"releaseResources": false, "autoResume": false}`)
	if code != http.StatusOK || !strings.Contains(body, `"sandboxId":"`+id+`"`) || strings.Contains(body, `"resourcesReleased":true`) {
		t.Errorf("REST pause: %d %s", code, body)
	}
	if got := r.pauses[len(r.pauses)-1]; got.Release == nil || *got.Release || got.AutoResume {
		t.Errorf("REST pause asked the runner %+v, want a freeze without auto-resume", got)
	}
	if code, body := e.rest(t, e.acme, "/v1/sandboxes/"+id+":resume", `{}`); code != http.StatusOK || !strings.Contains(body, `"deadline"`) {
		t.Errorf("REST resume: %d %s", code, body)
	}
	if code, body := e.rest(t, e.other, "/v1/sandboxes/"+id+":pause", `{}`); code != http.StatusNotFound {
		t.Errorf("REST pause of another organization's: %d %s", code, body)
	}

	// A runtime class that cannot checkpoint: a pause that must release is refused, a
	// pause left to the runner freezes.
	r.noCheckpoint = true
	_, err = e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id, ReleaseResources: proto.Bool(true)}))
	wantAPIError(t, "release on a runtime class without checkpoints", err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
	if err != nil && !strings.Contains(err.Error(), "gvisor") {
		t.Errorf("the refusal does not name the runtime class that can: %v", err)
	}
	res, err = e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id}))
	if err != nil || res.Msg.GetStatus().GetResourcesReleased() {
		t.Errorf("pause left to a runtime class without checkpoints: %v %v, want a freeze", res, err)
	}

	// Ended: not running.
	r.setState(id, runner.StateTerminated)
	_, err = e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id}))
	wantAPIError(t, "resume an ended sandbox", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "")
}

// TestPauseSettingsFromPolicy: the runner policy's base.pause reaches the runner in the
// spec's Meta at create, and PauseSandbox without auto_resume takes the sandbox's
// setting (off here), an explicit auto_resume wins.
func TestPauseSettingsFromPolicy(t *testing.T) {
	r := newPauseRunner("r1")
	e := newPauseEnv(t, `{"base": {"pause": {"lifetime": "HELD", "auto_resume": false, "idle_pause_seconds": 300}}}`, r)
	ctx := t.Context()
	id := e.create(t)
	meta := r.spec(id).Spec.Meta
	want := map[string]string{runtime.MetaPauseLifetime: "held", runtime.MetaAutoResume: "false", runtime.MetaIdlePause: "5m0s"}
	for k, v := range want {
		if meta[k] != v {
			t.Errorf("Meta[%s] = %q, want %q (Meta %v)", k, meta[k], v, meta)
		}
	}
	r.setState(id, runner.StateRunning)
	res, err := e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id}))
	if err != nil {
		t.Fatal(err)
	}
	if st := res.Msg.GetStatus(); st.GetAutoResume() || !st.GetLifetimeHeld() {
		t.Errorf("pause under the policy's settings: %v, want auto-resume off and the lifetime held", st)
	}
	// Exec on a paused sandbox without auto-resume: the gateway asks the runner (no early
	// refusal of its own), whose ErrPaused is FAILED_PRECONDITION NOT_RUNNING.
	_, err = e.sc.Exec(ctx, withKey(e.acme, &sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}}))
	wantAPIError(t, "exec on a paused sandbox without auto-resume", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "")
	if len(r.agents) != 1 {
		t.Errorf("the runner was asked for the agent %d times, want 1", len(r.agents))
	}
	if _, err := e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id, AutoResume: proto.Bool(true)})); err != nil {
		t.Fatal(err)
	}
	if !r.pauses[len(r.pauses)-1].AutoResume {
		t.Error("an explicit auto_resume true did not reach the runner")
	}
	// With auto-resume the runner resumes it for the call.
	_, _ = e.sc.Exec(ctx, withKey(e.acme, &sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}}))
	if len(r.agents) != 2 || r.spec(id).State != runner.StateRunning {
		t.Errorf("exec on a paused sandbox with auto-resume: agent asked %d times, state %v", len(r.agents), r.spec(id).State)
	}
}

// TestPauseNeedsPauseHandle: a runner without pause, resume and fork is refused with
// FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED naming it.
func TestPauseNeedsPauseHandle(t *testing.T) {
	r := &acceptingRunner{id: "plain"}
	e := newPauseEnv(t, "", r)
	ctx := t.Context()
	id := e.create(t)
	for what, call := range map[string]func() error{
		"pause": func() error {
			_, err := e.pc.PauseSandbox(ctx, withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id}))
			return err
		},
		"resume": func() error {
			_, err := e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id}))
			return err
		},
		"fork": func() error {
			_, err := e.pc.ForkSandbox(ctx, withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
			return err
		},
	} {
		err := call()
		wantAPIError(t, what, err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
		if err != nil && !strings.Contains(err.Error(), "runner plain") {
			t.Errorf("%s: %v does not name the runner", what, err)
		}
	}
}

// TestForkSandbox: forks are new sandboxes of the caller's organization on the source's
// runner, with IDs and share tokens of their own, readable like created ones; count is
// bounded; request_id makes the call idempotent (and retries only the failed forks);
// per-fork errors are listed; the runner must have room for all of them.
func TestForkSandbox(t *testing.T) {
	r := newPauseRunner("r1")
	r.maxSandboxes = 8
	e := newPauseEnv(t, "", r)
	ctx := t.Context()
	id := e.create(t, publicService(8082, https, share, 0))
	r.setState(id, runner.StateRunning)
	fork := func(key string, m *statev1.ForkSandboxRequest) (*statev1.ForkSandboxResponse, error) {
		res, err := e.pc.ForkSandbox(ctx, withKey(key, m))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	for _, n := range []int32{-1, 101} {
		_, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: n})
		wantAPIError(t, fmt.Sprintf("count %d", n), err, connect.CodeInvalidArgument, apierr.InvalidRequest, "count")
	}
	_, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, RequestId: strings.Repeat("x", MaxRequestIDBytes+1)})
	wantAPIError(t, "long request_id", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "request_id")
	_, err = fork(e.other, &statev1.ForkSandboxRequest{SandboxId: id})
	wantAPIError(t, "another organization's", err, connect.CodeNotFound, apierr.SandboxNotFound, "")
	if len(r.forks) != 0 {
		t.Fatalf("the runner was asked to fork by refused requests: %v", r.forks)
	}

	// count 0 is one fork.
	one, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(one.GetForks()) != 1 || one.GetForks()[0].GetError() != nil {
		t.Fatalf("count 0: %v", one)
	}
	// A fork carries its source's display name (and template, TestCreateSandboxFromTemplate).
	if got := e.get(t, one.GetForks()[0].GetSandboxId()).GetDisplayName(); got != "acme's sandbox" {
		t.Errorf("the fork's display_name = %q, want its source's", got)
	}

	// Three, one of which fails on the runner.
	r.forkErrs = map[int]error{1: fmt.Errorf("%w: no room for its checkpoint", runner.ErrNotRunning)}
	three, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: 3, RequestId: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	fs := three.GetForks()
	if len(fs) != 3 {
		t.Fatalf("count 3: %v", three)
	}
	if fe := fs[1].GetError(); fe.GetCode() != "FAILED_PRECONDITION" || fe.GetReason() != apierr.SandboxNotRunning || !strings.Contains(fe.GetMessage(), "no room for its checkpoint") {
		t.Errorf("failed fork's error: %v", fe)
	}
	targets := r.forks[len(r.forks)-1]
	seen := map[string]bool{id: true, one.GetForks()[0].GetSandboxId(): true}
	for _, k := range []int{0, 2} {
		f := fs[k]
		if f.GetError() != nil || seen[f.GetSandboxId()] {
			t.Errorf("fork %d: %v (IDs so far %v)", k, f, seen)
		}
		seen[f.GetSandboxId()] = true
		tgt := targets[k]
		if tgt.ID != f.GetSandboxId() || tgt.Meta[runtime.MetaOrg] != "acme" || tgt.Meta[runtime.MetaCaller] != e.acmeKeyID || tgt.Meta[runtime.MetaCreatedAt] != "" {
			t.Errorf("fork %d target %+v", k, tgt)
		}
		if tok := f.GetEndpointShareToken(); tok == "" || edge.ShareTokenHash(tok) != tgt.ShareTokenHash {
			t.Errorf("fork %d: share token %q does not match the hash the runner got %q", k, tok, tgt.ShareTokenHash)
		}
		sb := e.get(t, f.GetSandboxId())
		if sb.GetStatus().GetState() != sandboxv1.State_STATE_RUNNING || sb.GetStatus().GetRunnerId() != "r1" || sb.GetEndpointShareToken() != "" {
			t.Errorf("GetSandbox of fork %d: %v", k, sb)
		}
		if _, err := e.sc.GetSandbox(ctx, withKey(e.other, &sandboxv1.GetSandboxRequest{SandboxId: f.GetSandboxId()})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("another organization reads fork %d: %v", k, err)
		}
	}
	if fs[0].GetEndpointShareToken() == fs[2].GetEndpointShareToken() {
		t.Error("two forks share a token")
	}

	// The same request again: the same forks, and the failed one made now.
	r.forkErrs = nil
	calls := len(r.forks)
	again, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: 3, RequestId: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	ag := again.GetForks()
	if len(ag) != 3 || ag[0].GetSandboxId() != fs[0].GetSandboxId() || ag[2].GetSandboxId() != fs[2].GetSandboxId() ||
		ag[0].GetEndpointShareToken() != fs[0].GetEndpointShareToken() || ag[1].GetError() != nil || seen[ag[1].GetSandboxId()] {
		t.Errorf("replay: %v, first %v", again, three)
	}
	if len(r.forks) != calls+1 || len(r.forks[calls]) != 1 {
		t.Errorf("replay asked the runner for %v, want the one failed fork", r.forks[calls:])
	}
	calls = len(r.forks)
	if third, err := fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: 3, RequestId: "req-1"}); err != nil || !proto.Equal(third, again) || len(r.forks) != calls {
		t.Errorf("second replay: %v %v (runner asked %d more times)", third, err, len(r.forks)-calls)
	}
	_, err = fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: 2, RequestId: "req-1"})
	wantAPIError(t, "request_id with another count", err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")
	_, err = e.sc.CreateSandbox(ctx, withKey(e.acme, &sandboxv1.CreateSandboxRequest{RequestId: "req-1",
		Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "python:3.11"}}}}}))
	wantAPIError(t, "a create with a fork's request_id", err, connect.CodeInvalidArgument, apierr.RequestIDConflict, "request_id")
	// other's request_ids are its own
	if _, err := fork(e.other, &statev1.ForkSandboxRequest{SandboxId: id, RequestId: "req-1"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("another organization replays acme's request_id: %v", err)
	}

	e.s.views.probe(ctx) // the runner's count, without creates confirmed before it
	// Capacity: 5 sandboxes live, room for 8: three more fit, four do not.
	_, err = fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: 4})
	wantAPIError(t, "four forks with room for three", err, connect.CodeResourceExhausted, apierr.RunnerCapacityExhausted, "")
	if apierr.RetryInfo(err) == nil {
		t.Errorf("capacity refusal without RetryInfo: %v", err)
	}

	e.s.views.probe(ctx) // the runner's count, without creates confirmed before it
	// A paused source forks, over REST.
	r.setState(id, runner.StatePaused)
	code, body := e.rest(t, e.acme, "/v1/sandboxes/"+id+":fork", `{"count": 2}`)
	if code != http.StatusOK || strings.Count(body, `"sandboxId"`) != 2 || strings.Contains(body, `"error":{`) {
		t.Errorf("REST fork of a paused sandbox: %d %s", code, body)
	}

	// Refusals of the whole call.
	r.setState(id, runner.StateTerminated)
	_, err = fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: id})
	wantAPIError(t, "fork an ended sandbox", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "")
	src2 := fs[0].GetSandboxId()
	e.s.views.probe(ctx) // the runner's count, without creates confirmed before it
	r.noCheckpoint = true
	_, err = fork(e.acme, &statev1.ForkSandboxRequest{SandboxId: src2})
	wantAPIError(t, "fork on a runtime class without checkpoints", err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
}

// TestForkPolicy: a fork is a new sandbox: the source's runner's current policy must
// accept its spec.
func TestForkPolicy(t *testing.T) {
	r := newPauseRunner("r1")
	pol := `{}`
	e := newPauseEnv(t, "", r)
	e.s.policies = policySourceFunc(func() string { return pol })
	id := e.create(t)
	r.setState(id, runner.StateRunning)
	pol = `{"constraints": {"resources": {"max_cpu": "250m"}}}`
	e.s.views.poke()
	_, err := e.pc.ForkSandbox(t.Context(), withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(apierr.Violations(err)) == 0 {
		t.Errorf("fork under a policy that now refuses the spec: %v", err)
	}
}

type policySourceFunc func() string

func (f policySourceFunc) Policy(context.Context, string) ([]byte, int64, error) {
	doc := f()
	return []byte(doc), int64(len(doc)), nil
}
