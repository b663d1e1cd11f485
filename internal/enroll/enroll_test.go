package enroll

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// testCP is `sandboxd controlplane` in-process: one TLS listener on loopback.
type testCP struct {
	addr     string
	st       store.Store
	ca       *pki.CA
	srv      *http.Server
	adminKey string
	userKey  string
	admin    controlplanev1connect.RunnerManagementServiceClient
	user     controlplanev1connect.RunnerManagementServiceClient
}

func startCP(t *testing.T) *testCP {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	c := &testCP{st: st, ca: ca}
	if err := controlplane.EnsureOrg(ctx, st, "org-a"); err != nil {
		t.Fatal(err)
	}
	if c.adminKey, err = controlplane.EnsureAdminKey(ctx, st, "org-a"); err != nil {
		t.Fatal(err)
	}
	if c.userKey, _, err = auth.IssueKey(ctx, st, "org-a", auth.RoleUser, "user"); err != nil {
		t.Fatal(err)
	}
	c.start(t, "127.0.0.1:0")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "127.0.0.1"), ForceAttemptHTTP2: true}}
	c.admin = controlplanev1connect.NewRunnerManagementServiceClient(hc, "https://"+c.addr, connect.WithInterceptors(connecttest.Bearer(c.adminKey)))
	c.user = controlplanev1connect.NewRunnerManagementServiceClient(hc, "https://"+c.addr, connect.WithInterceptors(connecttest.Bearer(c.userKey)))
	return c
}

func (c *testCP) start(t *testing.T, addr string) {
	t.Helper()
	authn := auth.NewStoreAuthenticator(c.st, nil)
	t.Cleanup(authn.Wait)
	svc, err := controlplane.New(controlplane.Config{Store: c.st, Auth: authn, PlatformOrg: "org-a", CA: c.ca, HeartbeatInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := controlplane.TLSConfig(c.ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	for range 50 { // the port of a stopped control plane may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.addr = ln.Addr().String()
	c.srv = &http.Server{Handler: svc.TLSHandler(), TLSConfig: cfg}
	go func() { _ = c.srv.ServeTLS(ln, "", "") }()
	srv := c.srv
	t.Cleanup(func() { _ = srv.Close() })
}

func (c *testCP) createRunner(t *testing.T, id string, policy map[string]any) {
	t.Helper()
	p, err := structpb.NewStruct(policy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.CreateManagedRunner(t.Context(), connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: "c-" + id, Zone: "us-east-04a", Policy: p}})); err != nil {
		t.Fatal(err)
	}
}

func (c *testCP) token(t *testing.T, id string, ttl time.Duration) string {
	t.Helper()
	req := &controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	res, err := c.admin.CreateBootstrapToken(t.Context(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetBootstrapToken()
}

func wantCode(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || (reason != "" && apierr.Reason(err) != reason) {
		t.Fatalf("%s: %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
	}
}

func status(context.Context) (*Status, error) {
	return &Status{Version: "v-test", Ready: true, Capacity: &controlplanev1.RunnerResources{MilliCpu: 2000, MemoryBytes: 4 << 30},
		Usage: &controlplanev1.RunnerResources{MilliCpu: 500, Sandboxes: 1}, SandboxesTotal: 2}, nil
}

func TestRegistrationTokens(t *testing.T) {
	c := startCP(t)
	ctx := t.Context()
	c.createRunner(t, "r1", map[string]any{})

	// Only admins issue tokens, only for runners that exist.
	_, err := c.user.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: "r1"}))
	wantCode(t, "user key", err, connect.CodePermissionDenied, "")
	_, err = c.admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: "nope"}))
	wantCode(t, "unknown runner", err, connect.CodeNotFound, "")
	_, err = c.admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: "r1", Ttl: durationpb.New(48 * time.Hour)}))
	wantCode(t, "ttl too long", err, connect.CodeInvalidArgument, "")

	tok := c.token(t, "r1", 0)
	dir := t.TempDir()
	id, registered, err := LoadOrRegister(ctx, dir, c.addr, tok, nil)
	if err != nil || !registered {
		t.Fatalf("register: %v %v", registered, err)
	}
	leaf := id.Cert.Leaf
	if id.Org != "org-a" || id.RunnerID != "r1" || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "r1" ||
		len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://sandboxd/runner/org-a/r1" {
		t.Fatalf("identity %+v, cert DNS %v URIs %v", id, leaf.DNSNames, leaf.URIs)
	}
	if _, err := leaf.Verify(x509Opts(c)); err != nil {
		t.Errorf("certificate does not chain to the platform CA: %v", err)
	}

	// The token is spent: another runner cannot use it.
	_, err = Register(ctx, t.TempDir(), c.addr, tok, nil)
	wantCode(t, "reused token", err, connect.CodeUnauthenticated, apierr.BootstrapTokenInvalid)
	// A token the control plane never issued (right CA pin, wrong secret).
	forged, _, _ := controlplane.NewBootstrapToken(c.ca.Certificate())
	_, err = Register(ctx, t.TempDir(), c.addr, forged, nil)
	wantCode(t, "unknown token", err, connect.CodeUnauthenticated, apierr.BootstrapTokenInvalid)
	// An expired one.
	short := c.token(t, "r1", time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	_, err = Register(ctx, t.TempDir(), c.addr, short, nil)
	wantCode(t, "expired token", err, connect.CodeUnauthenticated, apierr.BootstrapTokenInvalid)
	// A token pinned to another CA: the runner refuses to talk to this control plane.
	other, _ := pki.LoadOrCreateCA(t.TempDir(), "other CA")
	wrongPin, _, _ := controlplane.NewBootstrapToken(other.Certificate())
	if _, err = Register(ctx, t.TempDir(), c.addr, wrongPin, nil); err == nil || !strings.Contains(err.Error(), "pin") {
		t.Errorf("wrong CA pin: %v", err)
	}
	// A fresh runner without a token says what to do.
	if _, _, err = LoadOrRegister(ctx, t.TempDir(), c.addr, "", nil); err == nil || !strings.Contains(err.Error(), "--bootstrap-token") {
		t.Errorf("fresh runner without token: %v", err)
	}

	// A restart uses the saved credentials; the (spent) token is not needed.
	again, registered, err := LoadOrRegister(ctx, dir, c.addr, "", nil)
	if err != nil || registered || again.RunnerID != "r1" || !again.Cert.Leaf.Equal(leaf) {
		t.Fatalf("restart: %v %v", registered, err)
	}
}

func TestRegistrationHeartbeat(t *testing.T) {
	c := startCP(t)
	ctx := t.Context()
	c.createRunner(t, "r1", map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 600}}})
	c.createRunner(t, "r2", map[string]any{})
	dir := t.TempDir()
	id, err := Register(ctx, dir, c.addr, c.token(t, "r1", 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
	if err != nil {
		t.Fatal(err)
	}
	if before.Msg.GetStatus().GetConnection() != controlplanev1.ConnectionStatus_DISCONNECTED {
		t.Fatalf("before any heartbeat: %v", before.Msg.GetStatus())
	}
	cache, err := OpenPolicyCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cache.Policy(ctx, "r1"); err == nil {
		t.Fatal("policy before the first heartbeat")
	}
	hb, err := NewHeartbeater(HeartbeatConfig{Identity: id, Cache: cache, Interval: 100 * time.Millisecond, Status: status})
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
	if err != nil {
		t.Fatal(err)
	}
	s := got.Msg.GetStatus()
	if s.GetConnection() != controlplanev1.ConnectionStatus_CONNECTED || !s.GetReady() || s.GetVersion() != "v-test" ||
		s.GetCapacity().GetMilliCpu() != 2000 || s.GetUsage().GetSandboxes() != 1 || got.Msg.GetEtag() != before.Msg.GetEtag() {
		t.Fatalf("after a heartbeat: %v etag %s (was %s)", s, got.Msg.GetEtag(), before.Msg.GetEtag())
	}
	doc, rev, err := cache.Policy(ctx, "r1")
	if err != nil || rev != 1 || !strings.Contains(string(doc), `"max_seconds"`) {
		t.Fatalf("cached policy %s rev %d %v", doc, rev, err)
	}

	// r1's certificate cannot heartbeat as r2, and no certificate cannot heartbeat at all.
	_, err = hb.client.Heartbeat(ctx, connect.NewRequest(&controlplanev1.HeartbeatRequest{RunnerId: "r2"}))
	wantCode(t, "r1's cert as r2", err, connect.CodePermissionDenied, apierr.RunnerIdentityMismatch)
	anon := controlplanev1connect.NewRunnerRegistrationServiceClient(httpClient(pki.ClientTLSConfig(nil, c.ca.Pool(), "127.0.0.1")), "https://"+c.addr)
	_, err = anon.Heartbeat(ctx, connect.NewRequest(&controlplanev1.HeartbeatRequest{RunnerId: "r1"}))
	wantCode(t, "no client cert", err, connect.CodeUnauthenticated, apierr.Unauthenticated)

	// A policy change reaches the runner on its next heartbeat, and is saved for restarts.
	strict, _ := structpb.NewStruct(map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 60}}})
	if _, err := c.admin.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: strict}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"policy"}}})); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	hb2, _ := NewHeartbeater(HeartbeatConfig{Identity: id, Cache: cache, Interval: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond, Status: status})
	go hb2.Run(runCtx)
	waitFor(t, "policy revision 2", func() bool { return cache.Revision() == 2 })
	reopened, err := OpenPolicyCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	if doc, rev, err := reopened.Policy(ctx, "r1"); err != nil || rev != 2 || !strings.Contains(string(doc), "60") {
		t.Fatalf("reloaded cache %s %d %v", doc, rev, err)
	}

	// Control plane down: the runner keeps its policy; admin writes fail UNAVAILABLE.
	addr := c.addr
	_ = c.srv.Close()
	time.Sleep(500 * time.Millisecond)
	if _, rev, err := cache.Policy(ctx, "r1"); err != nil || rev != 2 {
		t.Fatalf("policy while the control plane is down: %d %v", rev, err)
	}
	_, err = c.admin.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", DisplayName: "x"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"display_name"}}}))
	wantCode(t, "admin write with the control plane down", err, connect.CodeUnavailable, "")

	// Back on the same address: the runner reconnects by itself.
	c.start(t, addr)
	waitFor(t, "CONNECTED again", func() bool {
		before := time.Now()
		r, err := c.admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
		return err == nil && r.Msg.GetStatus().GetConnection() == controlplanev1.ConnectionStatus_CONNECTED &&
			r.Msg.GetStatus().GetLastHeartbeatTime().AsTime().After(before.Add(-150*time.Millisecond))
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func x509Opts(c *testCP) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: c.ca.Pool(), DNSName: "r1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
}

// TestControlPlaneAuthenticatesBeforeBodies: on the control plane's TLS port an admin call
// without a key gets 401 at once, its announced 100 MB body never read (issue 15 §2), and
// a key still works.
func TestControlPlaneAuthenticatesBeforeBodies(t *testing.T) {
	c := startCP(t)
	conn, err := tls.Dial("tcp", c.addr, &tls.Config{RootCAs: c.ca.Pool(), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_, err = fmt.Fprintf(conn, "POST /v1/sandbox/apiKeys HTTP/1.1\r\nHost: cp\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("HTTP %d, want 401", resp.StatusCode)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("answered after %v", d)
	}
	res, err := c.admin.ListManagedRunners(t.Context(), connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	if err != nil || res.Msg == nil {
		t.Errorf("an admin key: %v", err)
	}
}
