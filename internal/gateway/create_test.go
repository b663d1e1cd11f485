package gateway

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// acceptingRunner takes every sandbox at once, in CREATING, as a real runner does, and
// keeps what it was asked: the create path's output. It has an edge at
// sandboxd.test:8443.
type acceptingRunner struct {
	id  string
	mu  sync.Mutex
	got map[string]runner.Sandbox
}

func (r *acceptingRunner) ID() string    { return r.id }
func (r *acceptingRunner) Group() string { return "default" }
func (r *acceptingRunner) Create(_ context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = map[string]runner.Sandbox{}
	}
	if req.Spec.ID == "" { // the runner names it when the gateway did not
		req.Spec.ID = fmt.Sprintf("sandbox%d", len(r.got))
	}
	sb := runner.Sandbox{ID: req.Spec.ID, Spec: req.Spec, State: runner.StateCreating, CreatedAt: time.Now(), Lifetime: req.Lifetime}
	r.got[sb.ID] = sb
	return sb, nil
}
func (r *acceptingRunner) Get(_ context.Context, id string) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.got[id]
	if !ok {
		return runner.Sandbox{}, runner.ErrNotFound
	}
	return sb, nil
}
func (r *acceptingRunner) Delete(ctx context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	return r.Get(ctx, id)
}
func (r *acceptingRunner) Agent(context.Context, string) (agentv1connect.AgentServiceClient, error) {
	return nil, errors.New("not used")
}
func (r *acceptingRunner) Capacity(context.Context) (Capacity, error) {
	return Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, EdgeDomain: "sandboxd.test", EdgePort: 8443}, nil
}

const testOrg = "org-a"

// newTestGateway is a gateway over runners, its index in a SQLite store under dir.
func newTestGateway(t *testing.T, dir string, runners ...Runner) *Server {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func asOrg(ctx context.Context) context.Context {
	return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k1", Org: testOrg, Role: auth.RoleUser})
}

func endpointSpec(services ...*sandboxv1.Service) *sandboxv1.CreateSandboxRequest {
	return &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "python:3.11"}},
		Services:   services,
	}}}
}

func publicService(port int32, kind sandboxv1.EndpointKind, auth sandboxv1.EndpointAuth, timeout int32) *sandboxv1.Service {
	return &sandboxv1.Service{Port: port, Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC,
		Endpoint: &sandboxv1.EndpointSpec{Kind: kind, Auth: auth, RequestTimeoutSeconds: timeout}}
}

const (
	https    = sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS
	passthru = sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH
	open     = sandboxv1.EndpointAuth_ENDPOINT_AUTH_OPEN
	share    = sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN
)

// TestCreateAnswersCreatingWithEndpoints: the create response is CREATING with the
// passthrough address in endpoint.address (the official client keeps it only then, and
// only from there), and every HTTPS endpoint echoes its effective auth and request
// timeout (the client lists it in service_endpoints only with a positive timeout).
func TestCreateAnswersCreatingWithEndpoints(t *testing.T) {
	r := &acceptingRunner{id: "r1"}
	s := newTestGateway(t, t.TempDir(), r)
	res, err := s.CreateSandbox(asOrg(t.Context()), connect.NewRequest(endpointSpec(
		publicService(8443, passthru, 0, 0),
		publicService(8080, https, 0, 0),
		publicService(8081, https, open, 60),
		publicService(8082, https, share, 0),
	)))
	if err != nil {
		t.Fatal(err)
	}
	sb := res.Msg
	if got := sb.GetStatus().GetState(); got != sandboxv1.State_STATE_CREATING {
		t.Errorf("create answered %v, want STATE_CREATING", got)
	}
	want := []struct {
		address string
		auth    sandboxv1.EndpointAuth
		timeout int32
	}{
		{"8443-" + sb.GetSandboxId() + ".r1.sandboxd.test:8443", 0, 0},
		{"", open, DefaultRequestTimeoutSeconds}, // unset auth is OPEN, unset timeout the edge's default
		{"", open, 60},
		{"", share, DefaultRequestTimeoutSeconds},
	}
	if DefaultRequestTimeoutSeconds != int32(edge.DefaultTimeout/time.Second) || DefaultRequestTimeoutSeconds <= 0 {
		t.Fatalf("DefaultRequestTimeoutSeconds %d is not the edge's default %v", DefaultRequestTimeoutSeconds, edge.DefaultTimeout)
	}
	if len(sb.GetStatus().GetServices()) != len(want) {
		t.Fatalf("status services: %v", sb.GetStatus().GetServices())
	}
	for i, st := range sb.GetStatus().GetServices() {
		ep := st.GetEndpoint()
		if ep.GetAddress() != want[i].address || ep.GetAuth() != want[i].auth || ep.GetRequestTimeoutSeconds() != want[i].timeout {
			t.Errorf("service %d (port %d): endpoint %v, want address %q auth %v timeout %d", i, st.GetPort(), ep, want[i].address, want[i].auth, want[i].timeout)
		}
	}
}

func TestUnreportedStateIsCreating(t *testing.T) {
	p := sandboxProto("abc", &sandboxv1.SandboxSpec{}, runner.Sandbox{}, &acceptingRunner{id: "r1"})
	if got := p.GetStatus().GetState(); got != sandboxv1.State_STATE_CREATING {
		t.Errorf("a sandbox a runner accepted but has not reported is %v, want STATE_CREATING", got)
	}
}
