package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// portRunner is a pauseRunner that moves checkpoints through a (pretend) blob store
// (runner.PortHandle) as the contract says, keeping what it was asked. Its sandboxes
// are of runtime class gvisor, whose checkpoints need platform; its edge is
// <id>.sandboxd.test.
type portRunner struct {
	*pauseRunner
	platform string
	// full: it has no room to resume a checkpointed sandbox (Resume answers RESOURCE_
	// EXHAUSTED, as the local runner's admission does).
	full bool
	// importErr fails every ImportFork; movedErr every Moved; exportErr every
	// ExportCheckpoint.
	importErr, movedErr, exportErr error
	// importGate, when set, holds ImportFork until it is closed (importing is signalled
	// first).
	importGate, importing chan struct{}
	importOnce            sync.Once
	// onImport runs at each ImportFork (before it makes anything).
	onImport func()
	// capacityErr fails Capacity (the gateway's view: not connected).
	capacityErr error
	// egress is what ExportCheckpoint's ref carries as the sandbox's egress state.
	egress *runtime.EgressState

	exports  map[string]bool // live exported checkpoints by key
	exported []string        // sandboxes exported
	imports  []runner.ImportRequest
	moved    []string // "id>to"
	deleted  []string // sandboxes Delete was asked for
}

var _ runner.PortHandle = (*portRunner)(nil)

func newPortRunner(id, platform string) *portRunner {
	r := &portRunner{pauseRunner: newPauseRunner(id), platform: platform, exports: map[string]bool{}}
	r.got = map[string]runner.Sandbox{}
	return r
}

func (r *portRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	sb, err := r.pauseRunner.Create(ctx, req)
	r.mu.Lock()
	defer r.mu.Unlock()
	sb.RuntimeClass, sb.IP = "gvisor", "10.0.0.1"
	r.got[sb.ID] = sb
	return sb, err
}

func (r *portRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	r.mu.Lock()
	cerr := r.capacityErr
	r.mu.Unlock()
	if cerr != nil {
		return runner.Capacity{}, cerr
	}
	c, err := r.pauseRunner.Capacity(ctx)
	c.EdgeDomain = r.id + ".sandboxd.test"
	c.CheckpointClasses = []string{"gvisor"}
	if r.platform != "" {
		c.CheckpointPlatforms = map[string]string{"gvisor": r.platform}
	}
	return c, err
}

func (r *portRunner) Resume(ctx context.Context, id string) (runner.Sandbox, error) {
	r.mu.Lock()
	sb := r.got[id]
	full := r.full && sb.State == runner.StatePaused && sb.Pause != nil && sb.Pause.Released
	r.mu.Unlock()
	if full {
		return runner.Sandbox{}, apierr.WithRetry(apierr.New(apierr.RunnerCapacityExhausted,
			fmt.Sprintf("runner %s has no room to resume sandbox %s: needs 500m CPU, 0 free", r.id, id), nil), placement.RetryAfter)
	}
	return r.pauseRunner.Resume(ctx, id)
}

func (r *portRunner) Delete(_ context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleted = append(r.deleted, id)
	sb, ok := r.got[id]
	if !ok {
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	sb.State, sb.Reason, sb.EndedAt = runner.StateTerminated, "Deleted", time.Now()
	r.got[id] = sb
	return sb, nil
}

func (r *portRunner) List(context.Context) ([]runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Values(r.got)), nil
}

func (r *portRunner) ExportCheckpoint(_ context.Context, id string) (runner.CheckpointRef, runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.got[id]
	switch {
	case r.exportErr != nil:
		return runner.CheckpointRef{}, runner.Sandbox{}, r.exportErr
	case !ok:
		return runner.CheckpointRef{}, runner.Sandbox{}, runtime.ErrNotFound
	case sb.State != runner.StateRunning && sb.State != runner.StatePaused:
		return runner.CheckpointRef{}, runner.Sandbox{}, runner.ErrNotRunning
	}
	r.exported = append(r.exported, id)
	ref := runner.CheckpointRef{Key: fmt.Sprintf("checkpoints/%s/e%d/manifest.json", id, len(r.exported)), Platform: r.platform, Bytes: 1 << 20, Egress: r.egress}
	r.exports[ref.Key] = true
	return ref, sb, nil
}

func (r *portRunner) ImportFork(_ context.Context, req runner.ImportRequest) ([]runner.ForkResult, error) {
	if r.importGate != nil {
		r.importOnce.Do(func() { close(r.importing) })
		<-r.importGate
	}
	if r.onImport != nil {
		r.onImport()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.imports = append(r.imports, req)
	switch {
	case r.importErr != nil:
		return nil, r.importErr
	case req.Ref.Platform != r.platform:
		return nil, fmt.Errorf("%w: checkpoint of platform %q, this runner's is %q", runner.ErrCannotCheckpoint, req.Ref.Platform, r.platform)
	}
	out := make([]runner.ForkResult, len(req.Targets))
	for i, t := range req.Targets {
		sp := req.Source.Spec
		sp.ID, sp.ShareTokenHash, sp.Meta = t.ID, t.ShareTokenHash, maps.Clone(t.Meta)
		sb := runner.Sandbox{ID: t.ID, Spec: sp, State: runner.StateRunning, CreatedAt: time.Now(), StartedAt: time.Now(),
			Lifetime: req.Source.Lifetime, RuntimeClass: "gvisor", IP: "10.2.0.1"}
		if req.Move {
			sb.CreatedAt, sb.Deadline = req.Source.CreatedAt, time.Now().Add(time.Hour)
		}
		r.got[t.ID] = sb
		out[i].Sandbox = sb
	}
	return out, nil
}

func (r *portRunner) DeleteCheckpoint(_ context.Context, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.exports, key)
	return nil
}

func (r *portRunner) Moved(_ context.Context, id, to string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.movedErr != nil {
		return r.movedErr
	}
	r.moved = append(r.moved, id+">"+to)
	sb := r.got[id]
	sb.State, sb.Reason, sb.Pause, sb.EndedAt = runner.StateTerminated, runner.ReasonMoved, nil, time.Now()
	r.got[id] = sb
	return nil
}

func (r *portRunner) liveExports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.exports)
}

// createOn creates a sandbox pinned to runner id (with an HTTPS SHARE_TOKEN endpoint),
// and makes it RUNNING.
func (e *pauseEnv) createOn(t *testing.T, r *portRunner) string {
	t.Helper()
	req := endpointSpec(publicService(8082, https, share, 0))
	req.Sandbox.Spec.Containers[0].Resources = &sandboxv1.Resources{Cpu: "500m", Memory: "256Mi"}
	req.Sandbox.Spec.RunnerIds = []string{r.id}
	res, err := e.sc.CreateSandbox(t.Context(), withKey(e.acme, req))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	r.mu.Lock()
	sb := r.got[id]
	sb.State, sb.StartedAt = runner.StateRunning, time.Now()
	r.got[id] = sb
	r.mu.Unlock()
	return id
}

func (e *pauseEnv) pause(t *testing.T, id string, release bool) {
	t.Helper()
	res, err := e.pc.PauseSandbox(t.Context(), withKey(e.acme, &statev1.PauseSandboxRequest{SandboxId: id, ReleaseResources: proto.Bool(release)}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetStatus().GetResourcesReleased() != release {
		t.Fatalf("pause: %v", res.Msg)
	}
}

func (e *pauseEnv) resume(t *testing.T, id string, runnerIDs ...string) (*statev1.ResumeSandboxResponse, error) {
	t.Helper()
	e.s.views.probe(t.Context())
	res, err := e.pc.ResumeSandbox(t.Context(), withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id, RunnerIds: runnerIDs}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func (e *pauseEnv) storedRunner(t *testing.T, id string) string {
	t.Helper()
	x, err := e.s.index.st.Get(t.Context(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return x.RunnerID
}

// TestResumeMovesWhenFull: a checkpointed sandbox whose runner has no room to resume it
// moves to another runner with the same checkpoint platform: exported on the old one,
// imported on the new one with its ID, Meta and share token, the index (memory and
// store) names the new runner, the old one is told (Moved), the export is deleted; Get
// and exec go to the new runner, whose address and endpoint host names it shows.
func TestResumeMovesWhenFull(t *testing.T) {
	r1, r2 := newPortRunner("r1", "gvisor runsc-1 linux/amd64"), newPortRunner("r2", "gvisor runsc-1 linux/amd64")
	e := newPauseEnv(t, "", r1, r2)
	ctx := t.Context()
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	src := r1.spec(id)
	r1.full = true

	res, err := e.resume(t, id)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetSandboxId() != id || res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" || res.GetDeadline() == nil {
		t.Errorf("resume: %v, want it moved from r1 to r2", res)
	}
	if len(r2.imports) != 1 {
		t.Fatalf("r2 imports %d, want 1", len(r2.imports))
	}
	imp := r2.imports[0]
	if !imp.Move || len(imp.Targets) != 1 || imp.Targets[0].ID != id || !maps.Equal(imp.Targets[0].Meta, src.Spec.Meta) ||
		imp.Targets[0].ShareTokenHash == "" || imp.Targets[0].ShareTokenHash != src.Spec.ShareTokenHash || imp.Source.ID != id {
		t.Errorf("import %+v, want one move target with the source's ID, Meta and share token hash", imp)
	}
	if !slices.Equal(r1.moved, []string{id + ">r2"}) || r1.liveExports() != 0 || len(r1.exported) != 1 {
		t.Errorf("old runner: moved %v, live exports %d, exported %v", r1.moved, r1.liveExports(), r1.exported)
	}
	if got := e.storedRunner(t, id); got != "r2" {
		t.Errorf("stored runner %q, want r2", got)
	}
	sb := e.get(t, id)
	st := sb.GetStatus()
	if st.GetRunnerId() != "r2" || st.GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("Get after the move: %v", st)
	}
	if svc := st.GetServices(); len(svc) != 1 || !strings.Contains(svc[0].GetEndpoint().GetUrl(), "r2.sandboxd.test") {
		t.Errorf("endpoint after the move: %v, want r2's host name", svc)
	}
	_, _ = e.sc.Exec(ctx, withKey(e.acme, &sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}}))
	if !slices.Equal(r2.agents, []string{id}) || len(r1.agents) != 0 {
		t.Errorf("exec asked r1 %v, r2 %v for the agent, want r2 only", r1.agents, r2.agents)
	}
	// A gateway that reads the store afresh routes it to r2 as well.
	x, err := e.s.index.st.Get(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := fromStore(x); err != nil || rec.runnerID != "r2" {
		t.Errorf("record from the store: %+v %v", rec, err)
	}
	// Deleted there too.
	if _, err := e.sc.DeleteSandbox(ctx, withKey(e.acme, &sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r2.deleted, []string{id}) || len(r1.deleted) != 0 {
		t.Errorf("delete went to r1 %v, r2 %v", r1.deleted, r2.deleted)
	}
}

// TestResumeRunnerIDs: runner_ids naming the sandbox's runner resumes it there; naming
// another moves it there (the one named, among several that could); a frozen sandbox
// never moves; bad runner_ids are refused.
func TestResumeRunnerIDs(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2, r3 := newPortRunner("r1", plat), newPortRunner("r2", plat), newPortRunner("r3", plat)
	e := newPauseEnv(t, "", r1, r2, r3)
	ctx := t.Context()

	id := e.createOn(t, r1)
	e.pause(t, id, true)
	res, err := e.resume(t, id, "r1", "r2")
	if err != nil || res.GetRunnerId() != "r1" || res.GetMovedFrom() != "" || len(r2.imports)+len(r3.imports) != 0 {
		t.Fatalf("resume with runner_ids naming its runner: %v %v", res, err)
	}
	e.pause(t, id, true)
	res, err = e.resume(t, id, "r3")
	if err != nil || res.GetRunnerId() != "r3" || res.GetMovedFrom() != "r1" || len(r3.imports) != 1 || len(r2.imports) != 0 {
		t.Fatalf("resume pinned to r3: %v %v (imports r2 %d, r3 %d)", res, err, len(r2.imports), len(r3.imports))
	}
	if e.get(t, id).GetStatus().GetRunnerId() != "r3" {
		t.Error("Get does not show r3")
	}

	frozen := e.createOn(t, r1)
	e.pause(t, frozen, false)
	_, err = e.resume(t, frozen, "r2")
	wantAPIError(t, "move a frozen sandbox", err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
	if err != nil && !strings.Contains(err.Error(), "frozen") {
		t.Errorf("the refusal does not say it is frozen: %v", err)
	}
	if slices.Contains(r1.exported, frozen) || r1.spec(frozen).State != runner.StatePaused {
		t.Errorf("a refused move exported %v, left %v", r1.exported, r1.spec(frozen).State)
	}

	_, err = e.pc.ResumeSandbox(ctx, withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: frozen, RunnerIds: []string{"r2", "r2"}}))
	wantAPIError(t, "duplicate runner_ids", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "runner_ids[1]")
}

// TestResumeMoveRefusals: when no runner can take the checkpoint, the error says per
// runner why: FAILED_PRECONDITION CWSANDBOX_CHECKPOINT_NOT_SUPPORTED when none ever
// could (another platform, naming both; no import; not allowed), RESOURCE_EXHAUSTED
// with RetryInfo when one lacks only room.
func TestResumeMoveRefusals(t *testing.T) {
	r1, r2 := newPortRunner("r1", "gvisor runsc-1 linux/amd64"), newPortRunner("r2", "gvisor runsc-2 linux/amd64")
	r3 := newPauseRunner("r3") // pauses, moves nothing
	r4 := newPortRunner("r4", "gvisor runsc-1 linux/amd64")
	r4.maxSandboxes = 1
	e := newPauseEnv(t, "", r1, r2, r3, r4)
	_ = e.createOn(t, r4) // r4 is full
	id := e.createOn(t, r1)
	e.pause(t, id, true)

	_, err := e.resume(t, id, "r2", "r3")
	wantAPIError(t, "no runner can take it", err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
	for _, want := range []string{`r1: its runner, not allowed by runner_ids`, `r2: checkpoint platform differs`, `"gvisor runsc-1 linux/amd64"`,
		`"gvisor runsc-2 linux/amd64"`, `r3: cannot import checkpoints`, `r4: not allowed by runner_ids`} {
		if err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	var fields []string
	for _, v := range apierr.Violations(err) {
		fields = append(fields, v.Field)
	}
	if !slices.Equal(fields, []string{"runner[r1]", "runner[r2]", "runner[r3]", "runner[r4]"}) {
		t.Errorf("violations on %v", fields)
	}

	r1.full = true
	_, err = e.resume(t, id)
	wantAPIError(t, "only room is missing", err, connect.CodeResourceExhausted, apierr.RunnerCapacityExhausted, "")
	if apierr.RetryInfo(err) == nil || (err != nil && (!strings.Contains(err.Error(), "r4: no room") || !strings.Contains(err.Error(), "r1: its runner has no room"))) {
		t.Errorf("room refusal: %v (retry %v)", err, apierr.RetryInfo(err))
	}
	if r1.spec(id).State != runner.StatePaused || r1.liveExports() != 0 || len(r1.exported) != 0 {
		t.Errorf("a refused move left %v, exported %v", r1.spec(id).State, r1.exported)
	}

	// r4's policy now refuses the sandbox: it says so, with the constraint.
	e.s.policies = policyByRunner(func(id string) string {
		if id == "r4" {
			return `{"constraints": {"resources": {"max_cpu": "250m"}}}`
		}
		return `{}`
	})
	_, err = e.resume(t, id)
	if err == nil || !strings.Contains(err.Error(), "r4: its policy rejects it: ") || !strings.Contains(err.Error(), "250m") {
		t.Errorf("policy refusal: %v", err)
	}
}

// TestResumeMoveSourceNotConnected: while the gateway's view of the source's runner is
// not connected (just restarted, not probed again), its checkpoint platform is not
// known: a move is refused UNAVAILABLE with RetryInfo, not as never possible.
func TestResumeMoveSourceNotConnected(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	e := newPauseEnv(t, "", r1, r2)
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	r1.mu.Lock()
	r1.capacityErr = connect.NewError(connect.CodeUnavailable, errors.New("connection refused"))
	r1.mu.Unlock()
	_, err := e.resume(t, id, "r2")
	wantAPIError(t, "source not connected", err, connect.CodeUnavailable, apierr.RunnerUnavailable, "")
	if apierr.RetryInfo(err) == nil || err != nil && !strings.Contains(err.Error(), "r1: unavailable: not connected") {
		t.Errorf("refusal %v (retry %v): want r1 named unavailable, with RetryInfo", err, apierr.RetryInfo(err))
	}
	if len(r1.exported) != 0 || len(r2.imports) != 0 {
		t.Errorf("exported %v, imports %d: want none", r1.exported, len(r2.imports))
	}
	r1.mu.Lock()
	r1.capacityErr = nil
	r1.mu.Unlock()
	res, err := e.resume(t, id, "r2")
	if err != nil || res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" {
		t.Errorf("once r1 is connected again: %v %v, want moved to r2", res, err)
	}
}

type policyByRunner func(id string) string

func (f policyByRunner) Policy(_ context.Context, id string) ([]byte, int64, error) {
	doc := f(id)
	return []byte(doc), int64(len(doc)), nil
}

// TestResumeImportFails: an import that fails leaves the source PAUSED on its runner as
// it was, the index unchanged and the export deleted; the error is the target's.
func TestResumeImportFails(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	r2.importErr = fmt.Errorf("%w: blob store unreachable", runner.ErrCannotCheckpoint)
	e := newPauseEnv(t, "", r1, r2)
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	r1.full = true
	_, err := e.resume(t, id)
	wantAPIError(t, "import fails", err, connect.CodeFailedPrecondition, apierr.CheckpointNotSupported, "")
	if err != nil && !strings.Contains(err.Error(), "blob store unreachable") {
		t.Errorf("error %v is not the target's", err)
	}
	if sb := r1.spec(id); sb.State != runner.StatePaused || sb.Pause == nil || !sb.Pause.Released {
		t.Errorf("source after a failed import: %v %+v", sb.State, sb.Pause)
	}
	if len(r1.exported) != 1 || r1.liveExports() != 0 || len(r1.moved) != 0 {
		t.Errorf("exported %v, live %d, moved %v: want one export, deleted, no Moved", r1.exported, r1.liveExports(), r1.moved)
	}
	if got := e.storedRunner(t, id); got != "r1" || e.get(t, id).GetStatus().GetRunnerId() != "r1" {
		t.Errorf("index after a failed import names %q", got)
	}
}

// TestResumeSerialized: two resumes of one sandbox at once move it once; the second finds
// it on its new runner.
func TestResumeSerialized(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	e := newPauseEnv(t, "", r1, r2)
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	r1.full = true
	r2.importGate, r2.importing = make(chan struct{}), make(chan struct{})
	e.s.views.probe(t.Context())
	var (
		wg   sync.WaitGroup
		ress [2]*statev1.ResumeSandboxResponse
		errs [2]error
	)
	resume := func(i int) {
		res, err := e.pc.ResumeSandbox(t.Context(), withKey(e.acme, &statev1.ResumeSandboxRequest{SandboxId: id}))
		if err == nil {
			ress[i] = res.Msg
		}
		errs[i] = err
	}
	wg.Go(func() { resume(0) })
	<-r2.importing
	wg.Go(func() { resume(1) })
	time.Sleep(50 * time.Millisecond) // the second waits for the first's lock
	close(r2.importGate)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if len(r2.imports) != 1 || ress[0].GetMovedFrom() != "r1" || ress[1].GetRunnerId() != "r2" || ress[1].GetMovedFrom() != "" {
		t.Errorf("imports %d, answers %v %v", len(r2.imports), ress[0], ress[1])
	}
}

// TestForkAcrossRunners: forks the source's runner has no room for are made on another
// runner from its exported checkpoint (deleted afterwards), recorded with their runner;
// a fork splits between the source's runner and another; runner_ids pins; request_id
// replays; with no room anywhere, nothing is made.
func TestForkAcrossRunners(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	r1.maxSandboxes = 1
	e := newPauseEnv(t, "", r1, r2)
	ctx := t.Context()
	id := e.createOn(t, r1)
	fork := func(m *statev1.ForkSandboxRequest) (*statev1.ForkSandboxResponse, error) {
		e.s.views.probe(ctx)
		res, err := e.pc.ForkSandbox(ctx, withKey(e.acme, m))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	runnersOf := func(fs []*statev1.Fork) []string {
		var out []string
		for _, f := range fs {
			if f.GetError() != nil {
				t.Errorf("fork %s: %v", f.GetSandboxId(), f.GetError())
			}
			out = append(out, f.GetRunnerId())
			if got := e.get(t, f.GetSandboxId()).GetStatus().GetRunnerId(); got != f.GetRunnerId() {
				t.Errorf("fork %s on %q, Get says %q", f.GetSandboxId(), f.GetRunnerId(), got)
			}
		}
		return out
	}

	// The source's runner is full: both on r2.
	two, err := fork(&statev1.ForkSandboxRequest{SandboxId: id, Count: 2, RequestId: "req-2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := runnersOf(two.GetForks()); !slices.Equal(got, []string{"r2", "r2"}) {
		t.Errorf("forks on %v, want r2 twice", got)
	}
	if len(r1.forks) != 0 || len(r2.imports) != 1 || r2.imports[0].Move || len(r2.imports[0].Targets) != 2 || r2.imports[0].Source.ID != id {
		t.Errorf("r1 forks %v, r2 imports %+v", r1.forks, r2.imports)
	}
	if len(r1.exported) != 1 || r1.liveExports() != 0 {
		t.Errorf("exports %v, %d live: want one, deleted", r1.exported, r1.liveExports())
	}
	for _, f := range two.GetForks() {
		if f.GetEndpointShareToken() == "" {
			t.Errorf("fork %s without its share token", f.GetSandboxId())
		}
	}
	// Replayed: the same forks on r2, nothing made.
	again, err := fork(&statev1.ForkSandboxRequest{SandboxId: id, Count: 2, RequestId: "req-2"})
	if err != nil || !proto.Equal(again, two) || len(r2.imports) != 1 || len(r1.exported) != 1 {
		t.Errorf("replay: %v %v (imports %d), first %v", again, err, len(r2.imports), two)
	}

	// Room for one more on r1: one forked there, two imported on r2.
	r1.maxSandboxes = 2
	three, err := fork(&statev1.ForkSandboxRequest{SandboxId: id, Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := runnersOf(three.GetForks()); !slices.Equal(got, []string{"r1", "r2", "r2"}) {
		t.Errorf("split forks on %v, want r1 then r2 twice", got)
	}
	if len(r1.forks) != 1 || len(r1.forks[0]) != 1 || len(r2.imports) != 2 || len(r2.imports[1].Targets) != 2 {
		t.Errorf("r1 forks %v, r2 imports %d", r1.forks, len(r2.imports))
	}

	// runner_ids [r2]: there, though r1 has room.
	r1.maxSandboxes = 10
	pinned, err := fork(&statev1.ForkSandboxRequest{SandboxId: id, RunnerIds: []string{"r2"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := runnersOf(pinned.GetForks()); !slices.Equal(got, []string{"r2"}) {
		t.Errorf("pinned fork on %v", got)
	}

	// No room anywhere: nothing made.
	r1.maxSandboxes, r2.maxSandboxes = 1, 1
	imports, forks := len(r2.imports), len(r1.forks)
	_, err = fork(&statev1.ForkSandboxRequest{SandboxId: id, Count: 2})
	wantAPIError(t, "no room anywhere", err, connect.CodeResourceExhausted, apierr.RunnerCapacityExhausted, "")
	if len(r2.imports) != imports || len(r1.forks) != forks || r1.liveExports() != 0 {
		t.Errorf("a refused fork made forks (imports %d, forks %d, live exports %d)", len(r2.imports)-imports, len(r1.forks)-forks, r1.liveExports())
	}
	_, err = fork(&statev1.ForkSandboxRequest{SandboxId: id, RunnerIds: []string{""}})
	wantAPIError(t, "blank runner_ids", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "runner_ids[0]")
}

// TestReconcileStaleMovedCopy: a sandbox that moved whose old runner was not told keeps
// a paused copy there; the reconciler deletes it once it has been there longer than the
// grace period (from its start, not its creation), and never the copy on the record's
// runner, nor a copy just started on a runner the record does not name yet.
func TestReconcileStaleMovedCopy(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	r1.movedErr = errors.New("connection reset")
	e := newPauseEnv(t, "", r1, r2)
	e.s.orphanGrace = time.Minute
	ctx := t.Context()
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	r1.full = true
	if res, err := e.resume(t, id); err != nil || res.GetRunnerId() != "r2" {
		t.Fatalf("move: %v %v", res, err)
	}
	age := func(r *portRunner, id string, created, started time.Duration) {
		r.mu.Lock()
		defer r.mu.Unlock()
		sb := r.got[id]
		sb.CreatedAt, sb.StartedAt = time.Now().Add(-created), time.Now().Add(-started)
		r.got[id] = sb
	}
	// Both copies created long ago (a move keeps that); the one on r1 started 30s ago:
	// not yet.
	age(r1, id, time.Hour, 30*time.Second)
	age(r2, id, time.Hour, 0)
	if n := e.s.Reconcile(ctx); n != 0 || len(r1.deleted)+len(r2.deleted) != 0 {
		t.Errorf("reconcile within the grace deleted %d (r1 %v, r2 %v)", n, r1.deleted, r2.deleted)
	}
	age(r1, id, time.Hour, time.Hour)
	age(r2, id, time.Hour, time.Hour)
	if n := e.s.Reconcile(ctx); n != 1 || !slices.Equal(r1.deleted, []string{id}) || len(r2.deleted) != 0 {
		t.Errorf("reconcile deleted %d (r1 %v, r2 %v), want the stale copy on r1", n, r1.deleted, r2.deleted)
	}
	if got := e.get(t, id).GetStatus(); got.GetRunnerId() != "r2" || got.GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("after reconcile: %v", got)
	}

	// A move in flight: the copy imported on r2 runs before the record names r2. Not
	// deleted while fresh; a copy on r2 there long is (the record names r1), and never
	// the one on r1.
	other := e.createOn(t, r1)
	r2.mu.Lock()
	cp := r1.spec(other)
	r2.got[other] = cp
	r2.mu.Unlock()
	age(r1, other, time.Hour, time.Hour)
	age(r2, other, time.Hour, 0)
	r1.deleted, r2.deleted = nil, nil
	if n := e.s.Reconcile(ctx); n != 0 {
		t.Errorf("reconcile deleted %d (r1 %v, r2 %v), want none", n, r1.deleted, r2.deleted)
	}
	age(r2, other, time.Hour, time.Hour)
	if n := e.s.Reconcile(ctx); n != 1 || !slices.Equal(r2.deleted, []string{other}) || len(r1.deleted) != 0 {
		t.Errorf("reconcile deleted %d (r1 %v, r2 %v), want the copy on r2 only", n, r1.deleted, r2.deleted)
	}
}

// TestMoveSeenByAnotherReplica: a gateway replica that cached the sandbox on its old
// runner follows the move another replica made (the store names the new runner): Get,
// exec and resume go to the new runner.
func TestMoveSeenByAnotherReplica(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	e := newPauseEnv(t, "", r1, r2)
	ids := []string{e.createOn(t, r1), e.createOn(t, r1)}
	for _, id := range ids {
		e.pause(t, id, true)
	}
	s2, err := New(Config{Auth: e.keys, Runners: []runner.Handle{r1, r2}, Index: e.st.Sandboxes(), Orgs: e.st.Orgs(), Logger: e.s.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Close)
	ctx := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: e.acmeKeyID, Org: "acme", Role: auth.RoleUser})
	get := func(id string) *sandboxv1.SandboxStatus {
		t.Helper()
		res, err := s2.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetStatus()
	}
	for _, id := range ids {
		if st := get(id); st.GetRunnerId() != "r1" || st.GetState() != sandboxv1.State_STATE_PAUSED {
			t.Fatalf("replica before the move: %v", st)
		}
	}
	r1.full = true
	for _, id := range ids {
		if res, err := e.resume(t, id); err != nil || res.GetRunnerId() != "r2" {
			t.Fatalf("move: %v %v", res, err)
		}
	}
	if st := get(ids[0]); st.GetRunnerId() != "r2" || st.GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("replica's Get after the move: %v", st)
	}
	res, err := s2.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: ids[1]}))
	if err != nil || res.Msg.GetRunnerId() != "r2" || res.Msg.GetMovedFrom() != "" {
		t.Errorf("replica's resume after the move: %v %v", res, err)
	}
}

// TestMoveAbandonedWhenResumedMeanwhile: traffic that auto-resumed the sandbox on its old
// runner while its checkpoint was being imported elsewhere wins: the copy is deleted,
// the export too, and the sandbox stays on its runner, which the answer names.
func TestMoveAbandonedWhenResumedMeanwhile(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
	e := newPauseEnv(t, "", r1, r2)
	id := e.createOn(t, r1)
	e.pause(t, id, true)
	r1.full = true
	r2.onImport = func() { r1.setState(id, runner.StateRunning) }
	res, err := e.resume(t, id)
	if err != nil || res.GetRunnerId() != "r1" || res.GetMovedFrom() != "" {
		t.Fatalf("resume: %v %v, want it on r1", res, err)
	}
	if len(r2.imports) != 1 || !slices.Equal(r2.deleted, []string{id}) || r1.liveExports() != 0 || len(r1.moved) != 0 {
		t.Errorf("imports %d, r2 deleted %v, live exports %d, moved %v", len(r2.imports), r2.deleted, r1.liveExports(), r1.moved)
	}
	if got := e.storedRunner(t, id); got != "r1" || e.get(t, id).GetStatus().GetRunnerId() != "r1" {
		t.Errorf("index names %q", got)
	}
}
