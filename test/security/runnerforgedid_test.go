package security

import (
	"context"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// forgingRunner is org-b's own runner answering every create under the sandbox ID it
// is set to (another organization's), whatever it was asked.
type forgingRunner struct {
	tenantRunner
	fmu     sync.Mutex
	answer  string
	anyID   []string
	deleted []string
}

func (r *forgingRunner) Create(_ context.Context, req *connect.Request[runnerv1.CreateRequest]) (*connect.Response[runnerv1.CreateResponse], error) {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	r.anyID = append(r.anyID, req.Msg.GetSpec().GetMeta()[runtime.MetaAnyID])
	return connect.NewResponse(&runnerv1.CreateResponse{Sandbox: &runnerv1.Sandbox{Id: r.answer, State: runnerv1.State_STATE_CREATING}}), nil
}

func (r *forgingRunner) Delete(_ context.Context, req *connect.Request[runnerv1.DeleteRequest]) (*connect.Response[runnerv1.DeleteResponse], error) {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	r.deleted = append(r.deleted, req.Msg.GetId())
	return connect.NewResponse(&runnerv1.DeleteResponse{}), nil
}

// deleteLog is a platform runner that notes every Delete.
type deleteLog struct {
	*gatewaytest.StartingRunner
	mu      sync.Mutex
	deleted []string
}

func (r *deleteLog) Delete(ctx context.Context, id string, grace time.Duration) (runner.Sandbox, error) {
	r.mu.Lock()
	r.deleted = append(r.deleted, id)
	r.mu.Unlock()
	return r.Get(ctx, id)
}

// TestTenantRunnerForgedSandboxID: org-b's own runner answers org-b's create under the
// ID of org-a's live sandbox (on a platform runner). The gateway indexes a sandbox under
// the ID a runner answers with, so taking it would replace org-a's record (org-a's
// GetSandbox: not found) and have the reconciler delete org-a's sandbox as a stale copy.
// The create must fail; org-a's sandbox stays visible to org-a, invisible to org-b, and
// is not deleted; the tenant's runner is never asked to choose an ID.
func TestTenantRunnerForgedSandboxID(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "forged id test CA", "org-a", "org-b")
	keyA, keyB := p.key("org-a", auth.RoleAdmin), p.key("org-b", auth.RoleAdmin)

	// org-b's runner, under a certificate naming org-b (as its registration gives it).
	forger := &forgingRunner{}
	cert, err := p.CA.IssueServerURIs("b-runner", []string{"b-runner", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, []*url.URL{pki.RunnerURI("org-b", "b-runner")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, h := runnerv1connect.NewRunnerServiceHandler(forger)
	bClient := p.serveRunner("b-runner", h, cert, p.CA.Pool())
	platform := &deleteLog{StartingRunner: gatewaytest.NewStartingRunner("platform-1", runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30})}
	t.Cleanup(platform.Release)
	p.startGateway(gateway.Config{Runners: []runner.Handle{platform, bClient}})
	a, b := p.sandboxes(keyA), p.sandboxes(keyB)

	res, err := a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"platform-1"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	victim := res.Msg.GetSandboxId()

	forger.fmu.Lock()
	forger.answer = victim
	forger.fmu.Unlock()
	for {
		_, err = b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"b-runner"}}}}))
		forger.fmu.Lock()
		asked := len(forger.anyID)
		forger.fmu.Unlock()
		if asked > 0 || ctx.Err() != nil {
			break // the runner was reached (until its owner is known, it takes nothing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err == nil {
		t.Error("org-b's create answered under org-a's sandbox ID succeeded")
	}
	forger.fmu.Lock()
	anyID := slices.Clone(forger.anyID)
	forger.fmu.Unlock()
	if len(anyID) == 0 {
		t.Fatal("org-b's runner was never reached: the test proves nothing")
	}
	for _, v := range anyID {
		if v != "" {
			t.Errorf("org-b's runner was asked to choose the sandbox ID (%s=%q)", runtime.MetaAnyID, v)
		}
	}
	got, err := a.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: victim}))
	if err != nil {
		t.Fatalf("org-a's sandbox after org-b's runner answered under its ID: %v", err)
	}
	if got.Msg.GetStatus().GetState() != sandboxv1.State_STATE_CREATING && got.Msg.GetStatus().GetState() != sandboxv1.State_STATE_RUNNING {
		t.Errorf("org-a's sandbox is %v", got.Msg.GetStatus().GetState())
	}
	if _, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: victim})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("org-b gets org-a's sandbox: %v, want NOT_FOUND", err)
	}
	platform.mu.Lock()
	defer platform.mu.Unlock()
	if slices.Contains(platform.deleted, victim) {
		t.Error("org-a's live sandbox was deleted")
	}
}

// TestTenantRunnerChosenSandboxID: org-b's own runner answers org-b's create under an ID
// of its choosing that no sandbox has (so nothing but the gateway's check of the answered
// ID, answeredID, refuses it: the store takes a new ID, the index knows none). A tenant's
// runner is never asked to choose (only a platform runner's warm sandboxes may answer
// under their own ID): taken, the runner would name the sandbox, e.g. the ID another
// organization's next create is given. The create fails UNAVAILABLE CWSANDBOX_RUNNER_UNAVAILABLE
// (the runner's fault: it answered wrongly), the
// runner is told to delete what it answered, and org-b has no sandbox of that ID.
func TestTenantRunnerChosenSandboxID(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "chosen id test CA", "org-a", "org-b")
	keyB := p.key("org-b", auth.RoleAdmin)
	const chosen = "runnerchose0001x" // a valid sandbox ID (runtime.ValidID) no sandbox has
	if !runtime.ValidID(chosen, 63) {
		t.Fatalf("%q is not a valid ID: the test proves nothing", chosen)
	}
	forger := &forgingRunner{answer: chosen}
	cert, err := p.CA.IssueServerURIs("b-runner", []string{"b-runner", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, []*url.URL{pki.RunnerURI("org-b", "b-runner")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, h := runnerv1connect.NewRunnerServiceHandler(forger)
	bClient := p.serveRunner("b-runner", h, cert, p.CA.Pool())
	p.startGateway(gateway.Config{Runners: []runner.Handle{bClient}})
	b := p.sandboxes(keyB)

	for {
		_, err = b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"b-runner"}}}}))
		forger.fmu.Lock()
		asked := len(forger.anyID)
		forger.fmu.Unlock()
		if asked > 0 || ctx.Err() != nil {
			break // the runner was reached (until its owner is known, it takes nothing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	forger.fmu.Lock()
	anyID, deleted := slices.Clone(forger.anyID), slices.Clone(forger.deleted)
	forger.fmu.Unlock()
	if len(anyID) == 0 {
		t.Fatal("org-b's runner was never reached: the test proves nothing")
	}
	if slices.ContainsFunc(anyID, func(v string) bool { return v != "" }) {
		t.Errorf("org-b's runner was asked to choose the sandbox ID (%s: %q)", runtime.MetaAnyID, anyID)
	}
	if err == nil {
		t.Fatalf("org-b's create answered under the runner's own ID %s succeeded", chosen)
	}
	wantReason(t, "org-b's create answered under the runner's own ID", err, connect.CodeUnavailable, apierr.RunnerUnavailable)
	if !slices.Contains(deleted, chosen) {
		t.Errorf("the runner was not told to delete %s (deletes %q)", chosen, deleted)
	}
	if _, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: chosen})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("org-b gets the sandbox its runner named %s: %v, want NOT_FOUND", chosen, err)
	}
}

// emptyDeleteRunner is org-b's own runner listing a sandbox no gateway knows, long
// running, and answering every Delete with an empty reply (no sandbox in it).
type emptyDeleteRunner struct {
	tenantRunner
	dmu     sync.Mutex
	deleted []string
}

func (r *emptyDeleteRunner) List(context.Context, *connect.Request[runnerv1.ListRequest]) (*connect.Response[runnerv1.ListResponse], error) {
	return connect.NewResponse(&runnerv1.ListResponse{Sandboxes: []*runnerv1.Sandbox{{
		Id: "orphanofrunnerb1", State: runnerv1.State_STATE_RUNNING, CreatedAt: timestamppb.New(time.Now().Add(-time.Hour)),
		Spec: &runnerv1.Spec{Meta: map[string]string{runtime.MetaOrg: "org-b"}}}}}), nil
}

func (r *emptyDeleteRunner) Delete(_ context.Context, req *connect.Request[runnerv1.DeleteRequest]) (*connect.Response[runnerv1.DeleteResponse], error) {
	r.dmu.Lock()
	defer r.dmu.Unlock()
	r.deleted = append(r.deleted, req.Msg.GetId())
	return connect.NewResponse(&runnerv1.DeleteResponse{}), nil
}

// TestTenantRunnerEmptyDeleteReply: a runner's reply to Delete without a sandbox in it
// (org-b's own runner, not trusted) took the gateway down: the reply's sandbox was read
// through a nil pointer, and the gateway's reconciler (deleting the runner's sandbox that
// no gateway knows) does that outside any request, where nothing recovers the panic: the
// whole gateway process, every organization's, ended. The reconciler must delete the
// orphan, take the empty reply as an empty sandbox, and go on: it deletes it again on its
// next rounds and the gateway still answers.
func TestTenantRunnerEmptyDeleteReply(t *testing.T) {
	p, ctx := newTenantPlatform(t, time.Minute, "empty delete reply test CA", "org-a", "org-b")
	keyB := p.key("org-b", auth.RoleAdmin)
	r := &emptyDeleteRunner{}
	cert, err := p.CA.IssueServerURIs("b-runner", []string{"b-runner", "localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, []*url.URL{pki.RunnerURI("org-b", "b-runner")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, h := runnerv1connect.NewRunnerServiceHandler(r)
	bClient := p.serveRunner("b-runner", h, cert, p.CA.Pool())
	p.startGateway(gateway.Config{Runners: []runner.Handle{bClient}, ReconcileInterval: 20 * time.Millisecond, OrphanGrace: time.Second})
	for {
		r.dmu.Lock()
		n := len(r.deleted)
		r.dmu.Unlock()
		if n >= 3 { // three rounds: the reconciler survived two replies
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the reconciler deleted the orphan %d times, want 3", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.dmu.Lock()
	deleted := slices.Clone(r.deleted)
	r.dmu.Unlock()
	if slices.ContainsFunc(deleted, func(id string) bool { return id != "orphanofrunnerb1" }) {
		t.Errorf("deleted %q, want only the orphan", deleted)
	}
	if _, err := p.sandboxes(keyB).GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: "orphanofrunnerb1"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("the gateway after the empty replies: GetSandbox %v, want NOT_FOUND", err)
	}
}
