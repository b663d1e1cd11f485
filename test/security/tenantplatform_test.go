package security

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// tenantPlatform is the set-up the tenant-runner tests share, as the platform runs it
// for real: a runner CA and a store holding the platform organization and the others
// named; then, as each test needs them, a control plane (its API over HTTP, runner
// registration over TLS) that an organization's admin registers runners of its own
// with, those runners served under the certificates they got, and a gateway (over h2c)
// that places sandboxes on them beside the platform's. Everything is closed with the
// test.
type tenantPlatform struct {
	t   *testing.T
	ctx context.Context
	CA  *pki.CA
	St  store.Store
	DB  string // the store's SQLite file

	// The control plane's, once startControlPlane ran: the API's base URL, and the
	// registration address as runners dial it ("localhost:<port>").
	API, RegAddr string
	// The gateway's base URL, once startGateway ran.
	GW string
}

// newTenantPlatform makes the CA (named caName) and the store with the organizations
// "platform" and orgs; ctx, the test's context, ends after timeout.
func newTenantPlatform(t *testing.T, timeout time.Duration, caName string, orgs ...string) (p *tenantPlatform, ctx context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	tmp := t.TempDir()
	p = &tenantPlatform{t: t, ctx: ctx, DB: filepath.Join(tmp, "sandboxd.db")}
	var err error
	if p.CA, err = pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), caName); err != nil {
		t.Fatal(err)
	}
	if p.St, err = store.Open(ctx, p.DB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.St.Close() })
	for _, o := range append([]string{"platform"}, orgs...) {
		if err := controlplane.EnsureOrg(ctx, p.St, o); err != nil {
			t.Fatal(err)
		}
	}
	return p, ctx
}

// newCA makes another CA (a data-plane CA, say).
func (p *tenantPlatform) newCA(name string) *pki.CA {
	p.t.Helper()
	ca, err := pki.LoadOrCreateCA(filepath.Join(p.t.TempDir(), "pki"), name)
	if err != nil {
		p.t.Fatal(err)
	}
	return ca
}

// key issues an API key of org with role.
func (p *tenantPlatform) key(org string, role auth.Role) string {
	p.t.Helper()
	k, _, err := auth.IssueKey(p.ctx, p.St, org, role, org+" "+string(role))
	if err != nil {
		p.t.Fatal(err)
	}
	return k
}

// ensureRunner records org's runner id in the store (as an operator's configuration
// does), in cluster "c-<id>", zone "z".
func (p *tenantPlatform) ensureRunner(org, id string) {
	p.t.Helper()
	if _, _, err := controlplane.EnsureRunner(p.ctx, p.St, store.Runner{Org: org, RunnerID: id, ClusterID: "c-" + id, Zone: "z"}); err != nil {
		p.t.Fatal(err)
	}
}

// startControlPlane serves a control plane of cfg, whose Store, Auth, PlatformOrg and
// Logger are the platform's where unset: its API at p.API, its runner registration over
// TLS at p.RegAddr. Its CA is the platform's, p.CA, always (the registration server's
// certificate comes from it, and register, serveRunner and the tests trust it): cfg.CA
// another is a mistake of the test.
func (p *tenantPlatform) startControlPlane(cfg controlplane.Config) {
	p.t.Helper()
	if cfg.CA != nil && cfg.CA != p.CA {
		p.t.Fatal("startControlPlane: the control plane's CA is the platform's (p.CA)")
	}
	if cfg.Store == nil {
		cfg.Store = p.St
	}
	if cfg.Auth == nil {
		cfg.Auth = auth.NewStoreAuthenticator(p.St, nil)
	}
	if cfg.PlatformOrg == "" {
		cfg.PlatformOrg = "platform"
	}
	cfg.CA = p.CA
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cp, err := controlplane.New(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	cpTLS, err := controlplane.TLSConfig(p.CA, []string{"127.0.0.1"})
	if err != nil {
		p.t.Fatal(err)
	}
	regSrv := httptest.NewUnstartedServer(cp.TLSHandler())
	regSrv.TLS = cpTLS
	regSrv.EnableHTTP2 = true
	regSrv.StartTLS()
	p.t.Cleanup(regSrv.Close)
	p.RegAddr = strings.Replace(regSrv.URL, "https://127.0.0.1", "localhost", 1)
	apiSrv := httptest.NewServer(cp.Handler())
	p.t.Cleanup(apiSrv.Close)
	p.API = apiSrv.URL
}

// admin is the control plane's runner management API as the holder of key.
func (p *tenantPlatform) admin(key string) controlplanev1connect.RunnerManagementServiceClient {
	return controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, p.API, connect.WithInterceptors(connecttest.Bearer(key)))
}

// createRunner creates runner id (cluster "c-<id>", zone "z") as the holder of key.
func (p *tenantPlatform) createRunner(key, id string) error {
	_, err := p.admin(key).CreateManagedRunner(p.ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: "c-" + id, Zone: "z", Policy: &structpb.Struct{}}}))
	return err
}

// register registers runner id as a runner does, with a bootstrap token the holder of
// key creates for it (its creation failing fails the test): the identity the control
// plane gives it, or the registration's error.
func (p *tenantPlatform) register(key, id string) (*enroll.Identity, error) {
	p.t.Helper()
	tok, err := p.admin(key).CreateBootstrapToken(p.ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}))
	if err != nil {
		p.t.Fatal(err)
	}
	return enroll.Register(p.ctx, filepath.Join(p.t.TempDir(), id), p.RegAddr, tok.Msg.GetBootstrapToken(), p.CA.CertPEM())
}

// mustRegister is register, whose error fails the test.
func (p *tenantPlatform) mustRegister(key, id string) *enroll.Identity {
	p.t.Helper()
	ident, err := p.register(key, id)
	if err != nil {
		p.t.Fatal(err)
	}
	return ident
}

// serveRunner serves h as runner id under cert (verifying clients by cas), and returns
// the gateway's client of it (the gateway's certificate from the platform's CA, as the
// operator gives it).
func (p *tenantPlatform) serveRunner(id string, h http.Handler, cert tls.Certificate, cas *x509.CertPool) *runnerapi.Client {
	p.t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = runnerapi.ServerTLSConfigFromCert(cert, cas)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	p.t.Cleanup(srv.Close)
	gwTLS, err := runnerapi.ClientTLSConfig(p.CA, "gw", id)
	if err != nil {
		p.t.Fatal(err)
	}
	c, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: id, Addr: strings.TrimPrefix(srv.URL, "https://"), TLS: gwTLS})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(c.Close)
	return c
}

// startGateway serves a gateway of cfg, whose Auth, PlatformOrg, Index, Orgs and Logger
// are the platform's where unset, over h2c at p.GW.
func (p *tenantPlatform) startGateway(cfg gateway.Config) {
	p.t.Helper()
	if cfg.Auth == nil {
		cfg.Auth = auth.NewStoreAuthenticator(p.St, nil)
	}
	if cfg.PlatformOrg == "" {
		cfg.PlatformOrg = "platform"
	}
	if cfg.Index == nil {
		cfg.Index = p.St.Sandboxes()
	}
	if cfg.Orgs == nil {
		cfg.Orgs = p.St.Orgs()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(gw.Close)
	srv := httptest.NewUnstartedServer(gw.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	p.t.Cleanup(srv.Close)
	p.GW = srv.URL
}

// sandboxes, templates and discovery are the gateway's services over gRPC as the
// holder of key.
func (p *tenantPlatform) sandboxes(key string) sandboxv1connect.SandboxServiceClient {
	return sandboxv1connect.NewSandboxServiceClient(h2cClient(), p.GW, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
}

func (p *tenantPlatform) templates(key string) sandboxv1connect.SandboxTemplateServiceClient {
	return sandboxv1connect.NewSandboxTemplateServiceClient(h2cClient(), p.GW, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
}

func (p *tenantPlatform) discovery(key string) sandboxv1connect.DiscoveryServiceClient {
	return sandboxv1connect.NewDiscoveryServiceClient(h2cClient(), p.GW, connect.WithGRPC(), connect.WithInterceptors(connecttest.Bearer(key)))
}

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
