package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// stateRunner is a runner whose sandboxes are in the states the test sets.
type stateRunner struct {
	scriptedRunner
	mu     sync.Mutex
	states map[string]runner.State
}

func (r *stateRunner) Get(_ context.Context, id string) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.states[id]
	if !ok {
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	return runner.Sandbox{ID: id, State: st}, nil
}

// recordingIssuer records what it was asked to sign.
type recordingIssuer struct {
	org, id, container string
	perms              []sandboxv1.SandboxDataPermission
}

func (i *recordingIssuer) Issue(csr *x509.CertificateRequest, org, id, container string, perms []sandboxv1.SandboxDataPermission) ([]byte, time.Time, error) {
	i.org, i.id, i.container, i.perms = org, id, container, perms
	return []byte("chain"), time.Now().Add(time.Minute), nil
}

func (i *recordingIssuer) ServerCAPEM() []byte { return []byte("ca") }

func csrDER(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestConnectSandbox(t *testing.T) {
	r := &stateRunner{scriptedRunner: scriptedRunner{id: "r1"}, states: map[string]runner.State{
		"run": runner.StateRunning, "starting": runner.StateCreating, "done": runner.StateTerminated, "foreign": runner.StateRunning,
		"paused": runner.StatePaused,
	}}
	r.set(runner.Capacity{DataPlaneURI: "https://127.0.0.1:8444"}, nil)
	iss := &recordingIssuer{}
	s := &Server{runners: []runner.Handle{r}, log: slog.New(slog.DiscardHandler), index: newIndex(nil, slog.New(slog.DiscardHandler)), dataPlane: iss}
	s.views = newRunnerViews(s, time.Second)
	bg := context.Background()
	for id, org := range map[string]string{"run": "acme", "starting": "acme", "done": "acme", "foreign": "other", "paused": "acme"} {
		spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main"}}}
		if err := s.index.put(bg, &record{id: id, org: org, runnerID: "r1", spec: spec, createdAt: time.Now()}, ""); err != nil {
			t.Fatal(err)
		}
	}
	ctx := auth.WithPrincipal(bg, auth.Principal{Org: "acme"})
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	good := csrDER(t, p256)
	badSig := append([]byte(nil), good...)
	badSig[len(badSig)-3] ^= 0xff
	exec := []sandboxv1.SandboxDataPermission{sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC}
	logs := sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS

	call := func(m *sandboxv1.ConnectSandboxRequest) (*sandboxv1.SandboxConnection, error) {
		res, err := s.ConnectSandbox(ctx, connect.NewRequest(m))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	// Issued: DER and PEM, permissions deduplicated and sorted.
	for name, csr := range map[string][]byte{"der": good, "pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: good})} {
		got, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: csr, RequestedPermissions: []sandboxv1.SandboxDataPermission{5, 1, 5}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.GetEndpointUri() != "https://127.0.0.1:8444" || got.GetEndpointId() != "r1" ||
			got.GetTransport() != sandboxv1.SandboxDataTransport_SANDBOX_DATA_TRANSPORT_DIRECT_MTLS ||
			got.GetProtocol() != sandboxv1.SandboxDataProtocol_SANDBOX_DATA_PROTOCOL_CONNECT_H2_V1 ||
			string(got.GetClientCertificateChainPem()) != "chain" || string(got.GetServerCaBundlePem()) != "ca" ||
			len(got.GetGrantedPermissions()) != 2 || got.GetGrantedPermissions()[0] != 1 || got.GetGrantedPermissions()[1] != 5 {
			t.Fatalf("%s: %v", name, got)
		}
		if iss.org != "acme" || iss.id != "run" || iss.container != "main" {
			t.Fatalf("%s: issued for %+v", name, iss)
		}
	}

	// A paused sandbox is reached directly too: its runner resumes it (or answers
	// NOT_RUNNING) on the first call.
	if got, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "paused", CsrDer: good, RequestedPermissions: exec}); err != nil || iss.id != "paused" {
		t.Errorf("a paused sandbox: %v %v", got, err)
	}

	// Logs outlive the sandbox: a certificate for logs alone is issued for an ended one.
	if got, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "done", CsrDer: good, RequestedPermissions: []sandboxv1.SandboxDataPermission{logs}}); err != nil ||
		len(got.GetGrantedPermissions()) != 1 || got.GetGrantedPermissions()[0] != logs || iss.id != "done" {
		t.Errorf("logs of an ended sandbox: %v %v", got, err)
	}

	refusals := []struct {
		name   string
		m      *sandboxv1.ConnectSandboxRequest
		code   connect.Code
		reason string
		field  string
	}{
		{"no sandbox", &sandboxv1.ConnectSandboxRequest{CsrDer: good, RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "sandbox_id"},
		{"no csr", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"garbage csr", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: []byte("hello"), RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"pem without csr", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: []byte("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"), RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"bad signature", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: badSig, RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"P-384", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: csrDER(t, p384), RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"ed25519", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: csrDER(t, edKey), RequestedPermissions: exec}, connect.CodeInvalidArgument, apierr.InvalidRequest, "csr_der"},
		{"no permission", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good}, connect.CodeInvalidArgument, apierr.InvalidRequest, "requested_permissions"},
		{"unknown permission", &sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good, RequestedPermissions: []sandboxv1.SandboxDataPermission{1, 0}}, connect.CodeInvalidArgument, apierr.InvalidRequest, "requested_permissions[1]"},
		{"foreign", &sandboxv1.ConnectSandboxRequest{SandboxId: "foreign", CsrDer: good, RequestedPermissions: exec}, connect.CodeNotFound, apierr.SandboxNotFound, ""},
		{"missing", &sandboxv1.ConnectSandboxRequest{SandboxId: "nope", CsrDer: good, RequestedPermissions: exec}, connect.CodeNotFound, apierr.SandboxNotFound, ""},
		{"starting", &sandboxv1.ConnectSandboxRequest{SandboxId: "starting", CsrDer: good, RequestedPermissions: exec}, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, ""},
		{"terminated", &sandboxv1.ConnectSandboxRequest{SandboxId: "done", CsrDer: good, RequestedPermissions: exec}, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, ""},
		{"terminated, logs and exec", &sandboxv1.ConnectSandboxRequest{SandboxId: "done", CsrDer: good, RequestedPermissions: append([]sandboxv1.SandboxDataPermission{logs}, exec...)}, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, ""},
		{"starting, logs", &sandboxv1.ConnectSandboxRequest{SandboxId: "starting", CsrDer: good, RequestedPermissions: []sandboxv1.SandboxDataPermission{logs}}, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, ""},
	}
	for _, tc := range refusals {
		_, err := call(tc.m)
		if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason {
			t.Errorf("%s: got %v (%s), want %v %s", tc.name, err, apierr.Reason(err), tc.code, tc.reason)
			continue
		}
		if tc.field != "" {
			found := false
			for _, v := range apierr.Violations(err) {
				found = found || v.Field == tc.field
			}
			if !found {
				t.Errorf("%s: violations %v, want field %s", tc.name, apierr.Violations(err), tc.field)
			}
		}
	}

	// A key revoked after the call was authenticated gets no certificate.
	iss.id = ""
	s.auth = revokedKeys{}
	if _, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good, RequestedPermissions: exec}); connect.CodeOf(err) != connect.CodeUnauthenticated || apierr.Reason(err) != apierr.Unauthenticated {
		t.Errorf("revoked key: %v", err)
	}
	if iss.id != "" {
		t.Error("a certificate was issued for a revoked key")
	}
	s.auth = nil

	// A runner without a data plane.
	r.set(runner.Capacity{}, nil)
	s.views.probe(bg)
	if _, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good, RequestedPermissions: exec}); connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
		t.Errorf("runner without data plane: %v", err)
	}
	// A gateway without a data-plane CA.
	s.dataPlane = nil
	if _, err := call(&sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good, RequestedPermissions: exec}); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("gateway without data plane: %v", err)
	}
}

// revokedKeys is an authenticator whose every key has been revoked since it was checked.
type revokedKeys struct{}

func (revokedKeys) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}
func (revokedKeys) KeyActive(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

// ownedStateRunner is a stateRunner whose owner is vouched for (runner.OwnedHandle).
type ownedStateRunner struct {
	*stateRunner
	org   string
	known bool
}

func (r ownedStateRunner) Owner() (string, bool) { return r.org, r.known }

// TestConnectSandboxTenantRunnerHost: the direct address of a tenant organization's
// runner is handed to clients only when its announced host is one the control plane
// certifies for it (<runner_id>.<base-domain> or a name under it); a runner announcing
// another host (the platform's data-plane host, an IP, another runner's name) is offered
// no direct path, so AUTO clients use the gateway. A platform runner's host is the
// operator's: any.
func TestConnectSandboxTenantRunnerHost(t *testing.T) {
	bg := context.Background()
	good := csrDER(t, func() any { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }())
	exec := []sandboxv1.SandboxDataPermission{sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC}
	setup := func(org string, known bool, uri string) *Server {
		sr := &stateRunner{scriptedRunner: scriptedRunner{id: "t1"}, states: map[string]runner.State{"run": runner.StateRunning}}
		sr.set(runner.Capacity{DataPlaneURI: uri}, nil)
		s := &Server{runners: []runner.Handle{ownedStateRunner{sr, org, known}}, platformOrg: "platform", baseDomain: "sbx.example.com",
			log: slog.New(slog.DiscardHandler), index: newIndex(nil, slog.New(slog.DiscardHandler)), dataPlane: &recordingIssuer{}}
		s.views = newRunnerViews(s, time.Second)
		spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main"}}}
		if err := s.index.put(bg, &record{id: "run", org: "acme", runnerID: "t1", spec: spec, createdAt: time.Now()}, ""); err != nil {
			t.Fatal(err)
		}
		return s
	}
	call := func(s *Server) (*sandboxv1.SandboxConnection, error) {
		res, err := s.ConnectSandbox(auth.WithPrincipal(bg, auth.Principal{Org: "acme"}), connect.NewRequest(&sandboxv1.ConnectSandboxRequest{SandboxId: "run", CsrDer: good, RequestedPermissions: exec}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	for _, uri := range []string{"https://t1.sbx.example.com:8444", "https://dp.t1.sbx.example.com:443"} {
		got, err := call(setup("acme", true, uri))
		if err != nil || got.GetEndpointUri() != uri {
			t.Errorf("tenant runner at %s: %v %v", uri, got, err)
		}
	}
	for _, uri := range []string{"https://platform-dp.internal:8444", "https://127.0.0.1:8444", "https://[::1]:8444", "https://10.0.0.7:8444",
		"https://t2.sbx.example.com:8444", "https://dp.t2.sbx.example.com:8444", "https://T1.sbx.example.com:8444", "https://t1.sbx.example.com.:8444",
		"https://t1.sbx.example.com.evil.net:8444", "http://t1.sbx.example.com:8444", "https://u@t1.sbx.example.com:8444", "t1.sbx.example.com:8444", "://"} {
		got, err := call(setup("acme", true, uri))
		if connect.CodeOf(err) != connect.CodeUnimplemented || apierr.Reason(err) != apierr.NotImplemented {
			t.Errorf("tenant runner announcing %s: %v %v, want UNIMPLEMENTED %s", uri, got, err, apierr.NotImplemented)
		}
	}
	// The owner not verified yet: nothing (UNAVAILABLE, as for every call on its sandboxes).
	if got, err := call(setup("", false, "https://t1.sbx.example.com:8444")); err == nil {
		t.Errorf("runner of unknown owner: %v", got)
	} else if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("runner of unknown owner: %v", err)
	}
	// A platform runner keeps its operator's host.
	for _, uri := range []string{"https://127.0.0.1:8444", "https://platform-dp.internal:8444"} {
		if got, err := call(setup("platform", true, uri)); err != nil || got.GetEndpointUri() != uri {
			t.Errorf("platform runner at %s: %v %v", uri, got, err)
		}
	}
}
