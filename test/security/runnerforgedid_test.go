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

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
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
	fmu    sync.Mutex
	answer string
	anyID  []string
}

func (r *forgingRunner) Create(_ context.Context, req *connect.Request[runnerv1.CreateRequest]) (*connect.Response[runnerv1.CreateResponse], error) {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	r.anyID = append(r.anyID, req.Msg.GetSpec().GetMeta()[runtime.MetaAnyID])
	return connect.NewResponse(&runnerv1.CreateResponse{Sandbox: &runnerv1.Sandbox{Id: r.answer, State: runnerv1.State_STATE_CREATING}}), nil
}

func (r *forgingRunner) Delete(context.Context, *connect.Request[runnerv1.DeleteRequest]) (*connect.Response[runnerv1.DeleteResponse], error) {
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
