package dataplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// echoAgent answers Exec with the command joined by spaces.
type echoAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
}

func (echoAgent) Exec(_ context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	return connect.NewResponse(&agentv1.ExecResponse{Stdout: []byte(strings.Join(req.Msg.GetCommand(), " "))}), nil
}

// fakeSandboxes are sandboxes of one runner, all served by one agent.
type fakeSandboxes struct {
	mu    sync.Mutex
	sbs   map[string]runner.Sandbox
	agent agentv1connect.AgentServiceClient
	// containers are those the Agent calls named, in order.
	containers []string
}

func (f *fakeSandboxes) Get(_ context.Context, id string) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	return sb, nil
}

func (f *fakeSandboxes) Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error) {
	if _, err := f.Get(ctx, id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.containers = append(f.containers, container)
	f.mu.Unlock()
	return f.agent, nil
}

// Logs serves one line naming the sandbox and its state, as a runner serves the log of a
// live or an ended sandbox.
func (f *fakeSandboxes) Logs(ctx context.Context, id, container string, _ *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	sb, err := f.Get(ctx, id)
	if err != nil {
		return err
	}
	line := "log of " + id + " " + sb.State.String() + "\n"
	if container != "" {
		line = "log of " + container + " of " + id + " " + sb.State.String() + "\n"
	}
	return send(&agentv1.LogsResponse{Data: []byte(line), NextOffset: uint64(len(line))})
}

func (f *fakeSandboxes) set(id, org string, st runner.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbs[id] = runner.Sandbox{ID: id, State: st, Spec: runtime.Spec{Meta: map[string]string{runtime.MetaOrg: org}}}
}

func (f *fakeSandboxes) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sbs, id)
}

type fixture struct {
	t      *testing.T
	ca     *pki.CA
	l      *Listener
	uri    string
	sbs    *fakeSandboxes
	issuer *Issuer
}

func newFixture(t *testing.T) *fixture { t.Helper(); return newFixtureWith(t, nil) }

// newFixtureWith is newFixture with the runner's policy from pols (nil: none).
func newFixtureWith(t *testing.T, pols policy.Source) *fixture {
	t.Helper()
	agentSrv := httptest.NewServer(func() http.Handler {
		_, h := agentv1connect.NewAgentServiceHandler(echoAgent{})
		return h
	}())
	t.Cleanup(agentSrv.Close)
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sbs := &fakeSandboxes{sbs: map[string]runner.Sandbox{}, agent: agentv1connect.NewAgentServiceClient(agentSrv.Client(), agentSrv.URL)}
	sbs.set("sb1", "acme", runner.StateRunning)
	sbs.set("sb2", "acme", runner.StateRunning)
	l, uri, err := Start(ListenConfig{Listen: "127.0.0.1:0", CA: ca, Sandboxes: sbs, Logger: slog.New(slog.DiscardHandler), Policies: pols, RunnerID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return &fixture{t: t, ca: ca, l: l, uri: uri, sbs: sbs, issuer: &Issuer{CA: ca}}
}

// client issues a certificate from is (the fixture's CA by default) for sandbox id of
// org granting perms and returns a gRPC client of the data plane presenting it.
func (f *fixture) client(is *Issuer, org, id string, perms ...sandboxv1.SandboxDataPermission) sandboxv1connect.SandboxDataPlaneServiceClient {
	f.t.Helper()
	if is == nil {
		is = f.issuer
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		f.t.Fatal(err)
	}
	csr, _ := x509.ParseCertificateRequest(der)
	chain, _, err := is.Issue(csr, org, id, "main", perms)
	if err != nil {
		f.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(chain, mustPKCS8(f.t, key))
	if err != nil {
		f.t.Fatal(err)
	}
	return f.clientWith(&cert)
}

func (f *fixture) clientWith(cert *tls.Certificate) sandboxv1connect.SandboxDataPlaneServiceClient {
	return f.clientFrom(cert, "")
}

// clientFrom is clientWith connecting from the local address src ("" = any).
func (f *fixture) clientFrom(cert *tls.Certificate, src string) sandboxv1connect.SandboxDataPlaneServiceClient {
	cfg := pki.ClientTLSConfig(cert, f.ca.Pool(), "127.0.0.1")
	cfg.NextProtos = []string{"h2"}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	if src != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		tr.DialContext = d.DialContext
	}
	f.t.Cleanup(tr.CloseIdleConnections)
	return sandboxv1connect.NewSandboxDataPlaneServiceClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}, f.uri, connect.WithGRPC())
}

func exec(ctx context.Context, c sandboxv1connect.SandboxDataPlaneServiceClient, id string) (string, error) {
	res, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"echo", "hi"}}))
	if err != nil {
		return "", err
	}
	return string(res.Msg.GetStdout()), nil
}

const (
	permExec = sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC
	permRead = sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_READ_FILE
)

func TestDirectExec(t *testing.T) {
	f := newFixture(t)
	if !strings.HasPrefix(f.uri, "https://127.0.0.1:") {
		t.Fatalf("uri %s", f.uri)
	}
	out, err := exec(context.Background(), f.client(nil, "acme", "sb1", permExec), "sb1")
	if err != nil || out != "echo hi" {
		t.Fatalf("exec: %q, %v", out, err)
	}
	if n := f.l.Server.Calls(); n != 1 {
		t.Fatalf("%d calls counted, want 1", n)
	}
}

func TestDirectRefusals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	want := func(name string, err error, code connect.Code, reason string) {
		t.Helper()
		if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Errorf("%s: got %v (reason %q), want %v %s", name, err, apierr.Reason(err), code, reason)
		}
	}

	// Another sandbox's certificate.
	_, err := exec(ctx, f.client(nil, "acme", "sb2", permExec), "sb1")
	want("other sandbox", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	// A permission the certificate does not grant.
	_, err = exec(ctx, f.client(nil, "acme", "sb1", permRead), "sb1")
	want("missing permission", err, connect.CodePermissionDenied, apierr.PermissionDenied)
	// The right sandbox ID but another organization's (a forged or stale claim).
	_, err = exec(ctx, f.client(nil, "other", "sb1", permExec), "sb1")
	want("other org", err, connect.CodeNotFound, apierr.SandboxNotFound)
	// A container the sandbox does not have.
	_, err = f.client(nil, "acme", "sb1", permExec).Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Container: "sidecar", Command: []string{"true"}}))
	want("container", err, connect.CodeNotFound, apierr.ContainerNotFound)

	// Expired: the connection outlives the certificate.
	c := f.client(nil, "acme", "sb1", permExec)
	if _, err := exec(ctx, c, "sb1"); err != nil {
		t.Fatal(err)
	}
	f.l.Server.now = func() time.Time { return time.Now().Add(DefaultCertTTL + time.Minute) }
	_, err = exec(ctx, c, "sb1")
	want("expired", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	f.l.Server.now = time.Now

	// Replay after delete: the certificate is still valid, the sandbox is not.
	f.sbs.set("sb1", "acme", runner.StateTerminated)
	_, err = exec(ctx, c, "sb1")
	want("terminated", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning)
	f.sbs.remove("sb1")
	_, err = exec(ctx, c, "sb1")
	want("deleted", err, connect.CodeNotFound, apierr.SandboxNotFound)
	if n := f.l.Server.Calls(); n != 1 {
		t.Fatalf("%d calls admitted, want 1", n)
	}
}

func TestDirectHandshakeRefusals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// A certificate from another CA (e.g. the platform CA's) is refused at the handshake.
	other, err := pki.LoadOrCreateCA(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec(ctx, f.client(&Issuer{CA: other}, "acme", "sb2", permExec), "sb2"); err == nil {
		t.Error("foreign CA: accepted")
	}
	// No client certificate.
	if _, err := exec(ctx, f.clientWith(nil), "sb2"); err == nil {
		t.Error("no certificate: accepted")
	}
	// A certificate of the right CA without a sandbox identity.
	plain, err := f.ca.IssueClient("someone", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec(ctx, f.clientWith(&plain), "sb2"); err == nil {
		t.Error("no identity: accepted")
	}
	if n := f.l.Server.Calls(); n != 0 {
		t.Fatalf("%d calls admitted, want 0", n)
	}
}

func TestIdentityURI(t *testing.T) {
	id := Identity{Org: "a/b c", SandboxID: "sb-1", Container: "main", Perms: []sandboxv1.SandboxDataPermission{permRead, permExec}}
	u := id.URI()
	if !strings.HasPrefix(u.String(), "spiffe://sandboxd/sandbox/a%2Fb%20c/sb-1?") {
		t.Fatalf("uri %s", u)
	}
	got, err := ParseIdentity(&x509.Certificate{URIs: []*url.URL{u}})
	if err != nil || got.Org != id.Org || got.SandboxID != id.SandboxID || got.Container != "main" || len(got.Perms) != 2 || got.Perms[0] != permExec {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	for _, bad := range []string{"spiffe://sandboxd/sandbox/acme/sb?perm=nope", "spiffe://sandboxd/sandbox/acme?perm=exec", "spiffe://sandboxd/runner/r1"} {
		u, _ := url.Parse(bad)
		if _, err := ParseIdentity(&x509.Certificate{URIs: []*url.URL{u}}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func mustPKCS8(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// TestDirectUncompressed: the data plane sends responses uncompressed although the
// client offers gzip (gzipping a large file read cost more than the transfer), and
// still reads gzip-compressed requests.
func TestDirectUncompressed(t *testing.T) {
	f := newFixture(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr, _ := x509.ParseCertificateRequest(der)
	chain, _, err := f.issuer.Issue(csr, "acme", "sb1", "main", []sandboxv1.SandboxDataPermission{permExec})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(chain, mustPKCS8(t, key))
	if err != nil {
		t.Fatal(err)
	}
	cfg := pki.ClientTLSConfig(&cert, f.ca.Pool(), "127.0.0.1")
	cfg.NextProtos = []string{"h2"}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	rec := &connecttest.EnvelopeFlags{Base: tr}
	// connect-go offers gzip by default; this client also sends its requests gzipped.
	c := sandboxv1connect.NewSandboxDataPlaneServiceClient(&http.Client{Transport: rec}, f.uri, connect.WithGRPC(), connect.WithSendGzip())
	arg := strings.Repeat("a", 64<<10) // compresses well
	res, err := c.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Command: []string{"echo", arg}}))
	if err != nil || string(res.Msg.GetStdout()) != "echo "+arg {
		t.Fatalf("exec: %d bytes, %v", len(res.Msg.GetStdout()), err)
	}
	if f := rec.Flags(); len(f) != 1 || f[0]&1 != 0 {
		t.Fatalf("response envelope flags %v, want one uncompressed message", rec.Flags())
	}
}

// TestDirectLogsOfEndedSandbox: a logs certificate reads the log of an ended sandbox too
// (the runner keeps it); exec on it stays refused, and a sandbox the runner forgot is
// NOT_FOUND.
func TestDirectLogsOfEndedSandbox(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	permLogs := sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS
	logs := func(c sandboxv1connect.SandboxDataPlaneServiceClient) (string, error) {
		s, err := c.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: "sb1"}))
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for s.Receive() {
			if e := s.Msg().GetError(); e != nil {
				return b.String(), fmt.Errorf("%s: %s", e.GetCode(), e.GetMessage())
			}
			b.Write(s.Msg().GetData())
		}
		return b.String(), s.Err()
	}
	c := f.client(nil, "acme", "sb1", permLogs, permExec)
	for _, st := range []runner.State{runner.StateRunning, runner.StateTerminating, runner.StateCompleted, runner.StateFailed, runner.StateTerminated} {
		f.sbs.set("sb1", "acme", st)
		if got, err := logs(c); err != nil || got != "log of sb1 "+st.String()+"\n" {
			t.Errorf("logs of a %s sandbox: %q %v", st, got, err)
		}
	}
	if _, err := exec(ctx, c, "sb1"); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("exec on an ended sandbox: %v", err)
	}
	if _, err := logs(f.client(nil, "other", "sb1", permLogs)); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("logs with another organization's certificate: %v", err)
	}
	f.sbs.remove("sb1")
	if _, err := logs(c); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("logs of a forgotten sandbox: %v", err)
	}
}

// TestDirectContainerField: the request's container field picks the container of the
// sandbox whose agent (and log) a call reaches: the certificate grants the whole
// sandbox. A name the sandbox does not have is NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND
// naming it in the metadata, and reaches no agent.
func TestDirectContainerField(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.sbs.mu.Lock()
	f.sbs.sbs["sb1"] = runner.Sandbox{ID: "sb1", State: runner.StateRunning, Spec: runtime.Spec{
		Meta:      map[string]string{runtime.MetaOrg: "acme"},
		Container: runtime.Container{Name: "app", Image: "busybox"},
		Sidecars:  []runtime.Container{{Name: "db", Image: "redis"}},
	}}
	f.sbs.mu.Unlock()
	permLogs := sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS
	permWrite := sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_WRITE_FILE
	c := f.client(nil, "acme", "sb1", permExec, permRead, permWrite, permLogs)

	if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Container: "db", Command: []string{"true"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Command: []string{"true"}})); err != nil {
		t.Fatal(err)
	}
	_, _ = c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: "sb1", Container: "db", Path: "/etc/hostname"}))
	_, _ = c.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: "sb1", Container: "app", Path: "/tmp/x"}))
	f.sbs.mu.Lock()
	got := slices.Clone(f.sbs.containers)
	f.sbs.mu.Unlock()
	if want := []string{"db", "", "db", "app"}; !slices.Equal(got, want) {
		t.Errorf("containers reached: %q, want %q", got, want)
	}

	s, err := c.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: "sb1", Container: "db"}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for s.Receive() {
		b.Write(s.Msg().GetData())
	}
	if b.String() != "log of db of sb1 RUNNING\n" || s.Err() != nil {
		t.Errorf("logs of db: %q %v", b.String(), s.Err())
	}

	for name, call := range map[string]func() error{
		"exec": func() error {
			_, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Container: "cache", Command: []string{"true"}}))
			return err
		},
		"logs": func() error {
			s, err := c.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: "sb1", Container: "cache"}))
			if err != nil {
				return err
			}
			for s.Receive() {
			}
			return s.Err()
		},
		"main, the unnamed primary's name, when the primary is named": func() error {
			_, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Container: "main", Command: []string{"true"}}))
			return err
		},
	} {
		err := call()
		want := "cache"
		if strings.HasPrefix(name, "main") {
			want = "main"
		}
		if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.ContainerNotFound || apierr.Info(err).GetMetadata()["container"] != want {
			t.Errorf("%s: %v (reason %q, metadata %v), want NOT_FOUND %s naming %s", name, err, apierr.Reason(err), apierr.Info(err).GetMetadata(), apierr.ContainerNotFound, want)
		}
	}
	f.sbs.mu.Lock()
	n := len(f.sbs.containers)
	f.sbs.mu.Unlock()
	if n != len(got) {
		t.Errorf("an unknown container reached an agent: %d calls, want %d", n, len(got))
	}
}

// TestDirectContainerFieldClipped: a container field naming no container that is no
// valid name (100 KB here) is NOT_FOUND CONTAINER_NOT_FOUND quoting it clipped to 64
// bytes, in the message and the metadata.
func TestDirectContainerFieldClipped(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.sbs.mu.Lock()
	f.sbs.sbs["sb1"] = runner.Sandbox{ID: "sb1", State: runner.StateRunning, Spec: runtime.Spec{
		Meta:      map[string]string{runtime.MetaOrg: "acme"},
		Container: runtime.Container{Name: "app", Image: "busybox"},
		Sidecars:  []runtime.Container{{Name: "db", Image: "redis"}},
	}}
	f.sbs.mu.Unlock()
	c := f.client(nil, "acme", "sb1", permExec)
	_, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "sb1", Container: strings.Repeat("a", 100<<10), Command: []string{"true"}}))
	if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.ContainerNotFound {
		t.Fatalf("exec in a 100 KB container name: %v", err)
	}
	if md := apierr.Info(err).GetMetadata()["container"]; len(md) > 64 || len(err.Error()) > 300 {
		t.Errorf("the name quoted as %d bytes in metadata, message %d bytes", len(md), len(err.Error()))
	}
}
