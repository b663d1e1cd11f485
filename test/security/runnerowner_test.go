package security

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// tenantRunner is a runner an organization controls (its cluster, its host), as the
// attacker sees it: it serves RunnerService under the certificate its organization's
// registration gave it, and keeps every byte a gateway sends it.
type tenantRunner struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	mu       sync.Mutex
	received [][]byte // every request body, raw
	warmKeys []string // the keys of every warm target sent
	creates  []string // the organization of every create
}

func (r *tenantRunner) Capacity(context.Context, *connect.Request[runnerv1.CapacityRequest]) (*connect.Response[runnerv1.CapacityResponse], error) {
	return connect.NewResponse(&runnerv1.CapacityResponse{MilliCpu: 64000, MemoryBytes: 256 << 30, MaxSandboxes: 1000}), nil
}

func (r *tenantRunner) SetWarmPools(_ context.Context, req *connect.Request[runnerv1.SetWarmPoolsRequest]) (*connect.Response[runnerv1.SetWarmPoolsResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range req.Msg.GetTargets() {
		r.warmKeys = append(r.warmKeys, t.GetKey())
	}
	return connect.NewResponse(&runnerv1.SetWarmPoolsResponse{Accepted: int32(len(req.Msg.GetTargets()))}), nil //nolint:gosec // a handful
}

func (r *tenantRunner) Create(_ context.Context, req *connect.Request[runnerv1.CreateRequest]) (*connect.Response[runnerv1.CreateResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.creates = append(r.creates, req.Msg.GetSpec().GetMeta()[runtime.MetaOrg])
	return connect.NewResponse(&runnerv1.CreateResponse{Sandbox: &runnerv1.Sandbox{Id: req.Msg.GetSpec().GetId(), State: runnerv1.State_STATE_CREATING}}), nil
}

func (r *tenantRunner) List(context.Context, *connect.Request[runnerv1.ListRequest]) (*connect.Response[runnerv1.ListResponse], error) {
	return connect.NewResponse(&runnerv1.ListResponse{}), nil
}

// ServeHTTP keeps every request's body, then serves RunnerService.
func (r *tenantRunner) handler() http.Handler {
	_, h := runnerv1connect.NewRunnerServiceHandler(r)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.received = append(r.received, body)
		r.mu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, req)
	})
}

func (r *tenantRunner) snapshot() (received [][]byte, warm, creates []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.received), slices.Clone(r.warmKeys), slices.Clone(r.creates)
}

// TestTenantRunnerGetsOnlyItsOrganization: organization org-b registers a runner of its
// own with the control plane (a bootstrap token of its admin; the certificate names
// org-b), and the operator gives it to the gateway beside a platform runner. org-b
// controls that runner: it must never receive anything of org-a — a sandbox (even the
// least loaded runner, even named in runner_ids), a template, an image reference, a
// platform-registry pull token — nor be listed to org-a. org-b's own templates and
// sandboxes do go there (so the test is not vacuous).
func TestTenantRunnerGetsOnlyItsOrganization(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "runner owner test CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"platform", "org-a", "org-b"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range [][2]string{{"platform", "platform-1"}, {"org-b", "b-runner"}} {
		if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: r[0], RunnerID: r[1], ClusterID: "c-" + r[1], Zone: "z"}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(org string) string {
		k, _, err := auth.IssueKey(ctx, st, org, auth.RoleAdmin, org+" admin")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyA, keyB := key("org-a"), key("org-b")

	// org-b registers its runner: the control plane's record decides the certificate.
	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "platform", CA: ca,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cpTLS, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	regSrv := httptest.NewUnstartedServer(cp.TLSHandler())
	regSrv.TLS = cpTLS
	regSrv.EnableHTTP2 = true
	regSrv.StartTLS()
	t.Cleanup(regSrv.Close)
	apiSrv := httptest.NewServer(cp.Handler())
	t.Cleanup(apiSrv.Close)
	tok, err := controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(keyB))).
		CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: "b-runner"}))
	if err != nil {
		t.Fatal(err)
	}
	id, err := enroll.Register(ctx, filepath.Join(tmp, "b-runner"), strings.Replace(regSrv.URL, "https://127.0.0.1", "localhost", 1), tok.Msg.GetBootstrapToken(), ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	if id.Org != "org-b" {
		t.Fatalf("registered as %s/%s, want org-b", id.Org, id.RunnerID)
	}

	// org-b's runner, serving what it registered with.
	tenant := &tenantRunner{}
	runnerSrv := httptest.NewUnstartedServer(tenant.handler())
	runnerSrv.TLS = runnerapi.ServerTLSConfigFromCert(id.Cert, id.CAs)
	runnerSrv.EnableHTTP2 = true
	runnerSrv.StartTLS()
	t.Cleanup(runnerSrv.Close)
	gwTLS, err := runnerapi.ClientTLSConfig(ca, "gw", "b-runner")
	if err != nil {
		t.Fatal(err)
	}
	bClient, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: "b-runner", Addr: strings.TrimPrefix(runnerSrv.URL, "https://"), TLS: gwTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bClient.Close)
	// The platform's runner: busy, so that load alone would send everything to org-b's.
	platform := gatewaytest.NewStartingRunner("platform-1", runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, UsedMilliCPU: 3000, UsedMemoryBytes: 6 << 30, Running: 3})
	t.Cleanup(platform.Release)

	gw, err := gateway.New(gateway.Config{
		Auth: auth.NewStoreAuthenticator(st, nil), Runners: []runner.Handle{platform, bClient}, PlatformOrg: "platform",
		Policies: controlplane.NewPolicySource(st, "platform"),
		Index:    st.Sandboxes(), Orgs: st.Orgs(), Templates: st.Templates(),
		// Every image under reg.test is the platform registry's: pull tokens per organization.
		RegistryCredentials: func(org, image string) (string, string, bool) {
			if !strings.HasPrefix(image, "reg.test/") {
				return "", "", false
			}
			return "sandboxd", "pull-token-of-" + org, true
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	srv := httptest.NewUnstartedServer(gw.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	hc := func() *http.Client {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return &http.Client{Transport: tr}
	}
	sandboxes := func(key string) sandboxv1connect.SandboxServiceClient {
		return sandboxv1connect.NewSandboxServiceClient(hc(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	}
	templates := func(key string) sandboxv1connect.SandboxTemplateServiceClient {
		return sandboxv1connect.NewSandboxTemplateServiceClient(hc(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	}
	discovery := func(key string) sandboxv1connect.DiscoveryServiceClient {
		return sandboxv1connect.NewDiscoveryServiceClient(hc(), srv.URL, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
	}

	// Templates with warm pools, of platform-registry images (pull tokens minted).
	warm, err := structpb.NewStruct(map[string]any{"sandboxd.warmPool": map[string]any{"size": 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, image string }{{keyA, "reg.test/org-a/secret-app:v1"}, {keyB, "reg.test/org-b/app:v1"}} {
		if _, err := templates(c.key).CreateSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: &sandboxv1.SandboxTemplate{
			DisplayName: "app", Attachments: warm,
			Spec: &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: c.image}}},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	// org-b's template reaches its runner (it is connected, ready and fed).
	for {
		_, warmKeys, _ := tenant.snapshot()
		if slices.ContainsFunc(warmKeys, func(k string) bool { return strings.HasPrefix(k, "org-b/") }) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("org-b's runner never received org-b's template (warm keys %v)", warmKeys)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// org-a creates: none on org-b's runner, though it is nearly idle.
	a := sandboxes(keyA)
	for i := range 20 {
		if _, err := a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "reg.test/org-a/secret-app:v1"}}}}})); err != nil {
			t.Fatalf("org-a create %d: %v", i, err)
		}
	}
	// org-a names org-b's runner: refused as an unknown runner, org-b not named.
	_, err = a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"b-runner"}}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner || strings.Contains(err.Error(), "org-b") {
		t.Errorf("org-a pinned to org-b's runner: %v, want FAILED_PRECONDITION %s without org-b", err, apierr.NoSuitableRunner)
	}
	// org-a does not see it.
	for _, key := range []string{keyA} {
		res, err := discovery(key).ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Msg.GetRunners() {
			if r.GetRunnerId() == "b-runner" {
				t.Errorf("org-a lists org-b's runner")
			}
		}
	}
	_, err = discovery(keyA).GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{OrganizationId: "org-a", RunnerId: "b-runner"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("org-a gets org-b's runner: %v, want NOT_FOUND", err)
	}
	// org-b's own sandbox does go there.
	if _, err := sandboxes(keyB).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "reg.test/org-b/app:v1"}}, RunnerIds: []string{"b-runner"}}}})); err != nil {
		t.Fatalf("org-b create on its runner: %v", err)
	}
	// Another round of the warm loop after every write.
	if _, err := templates(keyA).CreateSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: &sandboxv1.SandboxTemplate{
		DisplayName: "app2", Spec: &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: "reg.test/org-a/other:v2"}}},
	}})); err != nil {
		t.Fatal(err)
	}
	sent := func() int { r, _, _ := tenant.snapshot(); return len(r) }
	for n := sent(); sent() < n+2; { // two more requests (a warm set, a probe) at least
		select {
		case <-ctx.Done():
			t.Fatal("org-b's runner heard nothing more")
		case <-time.After(20 * time.Millisecond):
		}
	}

	received, warmKeys, creates := tenant.snapshot()
	if !slices.Equal(creates, []string{"org-b"}) {
		t.Errorf("creates on org-b's runner by organization: %v, want org-b's one only", creates)
	}
	for _, k := range warmKeys {
		if !strings.HasPrefix(k, "org-b/") {
			t.Errorf("org-b's runner was sent warm target %q", k)
		}
	}
	for i, body := range received {
		for _, secret := range []string{"org-a", "pull-token-of-org-a", "secret-app", "reg.test/org-a"} {
			if bytes.Contains(body, []byte(secret)) {
				t.Errorf("request %d to org-b's runner carries %q", i, secret)
			}
		}
	}
	if !slices.ContainsFunc(received, func(b []byte) bool { return bytes.Contains(b, []byte("pull-token-of-org-b")) }) {
		t.Error("org-b's runner never got org-b's pull token: the test proves nothing")
	}
}
