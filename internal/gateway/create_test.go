package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// acceptingRunner takes every sandbox at once, in CREATING, as a real runner does, and
// keeps what it was asked: the create path's output. It has an edge at
// sandboxd.test:8443 and says whether that edge checks share tokens.
type acceptingRunner struct {
	id          string
	shareTokens bool
	// engineImage: it runs container-engine sandboxes with it under gvisor ("": none).
	engineImage string
	// noSecretRefs: it reads no KUBERNETES secret store (a local runner's backend).
	noSecretRefs bool
	mu           sync.Mutex
	got          map[string]runner.Sandbox
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
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	return sb, nil
}
func (r *acceptingRunner) Delete(ctx context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	return r.Get(ctx, id)
}
func (r *acceptingRunner) Agent(context.Context, string, string) (agentv1connect.AgentServiceClient, error) {
	return nil, errors.New("not used")
}
func (r *acceptingRunner) Logs(context.Context, string, string, *agentv1.LogsRequest, func(*agentv1.LogsResponse) error) error {
	return errors.New("not used")
}
func (r *acceptingRunner) Capacity(context.Context) (runner.Capacity, error) {
	c := runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, EdgeDomain: "sandboxd.test", EdgePort: 8443,
		Support: runtime.Support{NoShareTokens: !r.shareTokens, NoContainerEngine: r.engineImage == "", NoSecretRefs: r.noSecretRefs}}
	if r.engineImage != "" {
		c.RuntimeClasses = []string{"runc", "gvisor"}
		c.EngineImage, c.EngineRuntimeClass = r.engineImage, "gvisor"
	}
	return c, nil
}

func (r *acceptingRunner) spec(id string) runner.Sandbox {
	sb, _ := r.Get(context.Background(), id)
	return sb
}

const testOrg = "org-a"

// newTestGateway is a gateway over runners, its index in a SQLite store under dir.
func newTestGateway(t *testing.T, dir string, runners ...runner.Handle) *Server {
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
	r := &acceptingRunner{id: "r1", shareTokens: true}
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
		{"", open, spec.DefaultRequestTimeoutSeconds}, // unset auth is OPEN, unset timeout the edge's default
		{"", open, 60},
		{"", share, spec.DefaultRequestTimeoutSeconds},
	}
	if spec.DefaultRequestTimeoutSeconds != int32(edge.DefaultTimeout/time.Second) || spec.DefaultRequestTimeoutSeconds <= 0 {
		t.Fatalf("spec.DefaultRequestTimeoutSeconds %d is not the edge's default %v", spec.DefaultRequestTimeoutSeconds, edge.DefaultTimeout)
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

// TestShareTokenOnlyInCreate: an HTTPS SHARE_TOKEN endpoint gets a random token in the
// create response and nowhere else; a replay of the request_id gives the same token, a
// new request_id another; the runner and the store get its SHA-256 only.
func TestShareTokenOnlyInCreate(t *testing.T) {
	dir := t.TempDir()
	r := &acceptingRunner{id: "r1", shareTokens: true}
	s := newTestGateway(t, dir, r)
	ctx := asOrg(t.Context())
	create := func(requestID string) *sandboxv1.Sandbox {
		t.Helper()
		req := endpointSpec(publicService(8080, https, share, 0), publicService(8081, https, open, 0))
		req.RequestId = requestID
		res, err := s.CreateSandbox(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	first := create("5d0e7a50-0000-4000-8000-000000000001")
	token := first.GetEndpointShareToken()
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < 16 {
		t.Fatalf("share token %q: want URL-safe base64 of at least 128 bits (%v)", token, err)
	}
	if h := r.spec(first.GetSandboxId()).Spec.ShareTokenHash; h != edge.ShareTokenHash(token) {
		t.Errorf("the runner got share token hash %q, want SHA-256 of the token", h)
	}
	again := create("5d0e7a50-0000-4000-8000-000000000001")
	if again.GetSandboxId() != first.GetSandboxId() || again.GetEndpointShareToken() != token {
		t.Errorf("a replay got sandbox %s (token equal: %v); want the first one and its token", again.GetSandboxId(), again.GetEndpointShareToken() == token)
	}
	other := create("5d0e7a50-0000-4000-8000-000000000002")
	if other.GetEndpointShareToken() == "" || other.GetEndpointShareToken() == token {
		t.Error("another request_id got no share token or the first sandbox's")
	}
	noShare, err := s.CreateSandbox(ctx, connect.NewRequest(endpointSpec(publicService(8080, https, open, 0))))
	if err != nil || noShare.Msg.GetEndpointShareToken() != "" || r.spec(noShare.Msg.GetSandboxId()).Spec.ShareTokenHash != "" {
		t.Errorf("a sandbox without SHARE_TOKEN endpoints got a share token (%v)", err)
	}

	// Get, List and Delete never carry it, nor does anything the runner or the store keep.
	var out []string
	got, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: first.GetSandboxId()}))
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, protojson.Format(got.Msg))
	list, err := s.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil || len(list.Msg.GetSandboxes()) != 3 {
		t.Fatalf("list: %v %v", list, err)
	}
	out = append(out, protojson.Format(list.Msg))
	del, err := s.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: first.GetSandboxId()}))
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, protojson.Format(del.Msg))
	spec, _ := json.Marshal(r.spec(first.GetSandboxId()).Spec)
	out = append(out, string(spec))
	for i, o := range out {
		if strings.Contains(o, token) || strings.Contains(o, "endpointShareToken") {
			t.Errorf("answer %d carries the share token: %s", i, o)
		}
	}
	s.Close()
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), token) || strings.Contains(string(b), other.GetEndpointShareToken()) {
			t.Errorf("%s holds a share token", path)
		}
		return nil
	})
}

// TestShareTokensNeedARunnerThatChecksThem: a runner whose edge does not check share
// tokens gets no sandbox with a SHARE_TOKEN endpoint; when no runner does, the create
// is FAILED_PRECONDITION CWSANDBOX_HTTPS_SHARE_TOKEN_NOT_SUPPORTED.
func TestShareTokensNeedARunnerThatChecksThem(t *testing.T) {
	ctx := asOrg(t.Context())
	old := &acceptingRunner{id: "old"}
	s := newTestGateway(t, t.TempDir(), old)
	_, err := s.CreateSandbox(ctx, connect.NewRequest(endpointSpec(publicService(8080, https, share, 0))))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.HTTPSShareTokenNotSupported {
		t.Fatalf("create on a runner without share tokens: %v (%s), want FAILED_PRECONDITION %s", err, apierr.Reason(err), apierr.HTTPSShareTokenNotSupported)
	}
	if _, err := s.CreateSandbox(ctx, connect.NewRequest(endpointSpec(publicService(8080, https, open, 0)))); err != nil {
		t.Fatalf("an OPEN endpoint on that runner: %v", err)
	}

	// With a runner that checks them as well, the sandbox goes there.
	newer := &acceptingRunner{id: "new", shareTokens: true}
	s = newTestGateway(t, t.TempDir(), old, newer)
	for range 5 {
		res, err := s.CreateSandbox(ctx, connect.NewRequest(endpointSpec(publicService(8080, https, share, 0))))
		if err != nil {
			t.Fatal(err)
		}
		if id := res.Msg.GetStatus().GetRunnerId(); id != "new" || res.Msg.GetEndpointShareToken() == "" {
			t.Fatalf("placed on %s with token %v, want on new with one", id, res.Msg.GetEndpointShareToken() != "")
		}
	}
}
