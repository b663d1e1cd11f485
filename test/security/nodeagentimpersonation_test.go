package security

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/nodeagent/store"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

// The runner's side of the node agent (internal/runtime/kubernetes/nodeagentdial) from
// the other direction: whoever answers at a node's agent address — any Pod on the node's
// network can listen there, or reach the runner's dials — must not pass for the agent.
// The runner's verification alone must refuse it (its client certificate is always one
// the real agent would accept), and an answer it does accept must not name a checkpoint
// of another runner's.

// impostorAgent serves TLS 1.3 (h2) with cert and the node-agent service answering
// Checkpoint with id; hit counts the requests that reached it.
func impostorAgent(t *testing.T, cert tls.Certificate, id string) (addr string, hit *atomic.Int32) {
	t.Helper()
	hit = new(atomic.Int32)
	_, h := nodeagentv1connect.NewNodeAgentServiceHandler(impostorService{id: id, hit: hit})
	return serveAgentHandler(t, cert, h), hit
}

// serveAgentHandler serves h over TLS 1.3 (h2) with cert (no client certificate asked)
// and returns its address.
func serveAgentHandler(t *testing.T, cert tls.Certificate, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, Protocols: new(http.Protocols),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}}
	hs.Protocols.SetHTTP2(true)
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

type impostorService struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	id  string
	hit *atomic.Int32
}

func (s impostorService) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	s.hit.Add(1)
	return connect.NewResponse(&nodeagentv1.CheckpointResponse{CheckpointId: s.id, Node: "node-1", Bytes: 1, Took: durationpb.New(time.Millisecond)}), nil
}

// TestSecurityNodeAgentImpersonation: runner-a's dialer (DialConfig with its
// --node-agent-tls-dir: a client certificate the real agent accepts) refuses, at the
// handshake, an agent whose certificate is not of its ca.crt (x509.UnknownAuthorityError:
// also the real agent when ca.crt is another CA), one of the right CA for another name
// (x509.HostnameError), a runner's client certificate presented as the server's, and a
// clientAuth-only certificate that names the agents (x509 IncompatibleUsage); none of
// them receives the request. A server with a genuine agent certificate that answers
// another runner's checkpoint ID is refused too: the backend gets no ID.
func TestSecurityNodeAgentImpersonation(t *testing.T) {
	a := startSecAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ccert, err := a.ca.IssueClient("runner-a", []*url.URL{pki.NodeAgentClientURI("runner-a")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := pki.LoadOrCreateCA(t.TempDir(), "an attacker's CA")
	if err != nil {
		t.Fatal(err)
	}
	checkpoint := func(addr string, caPEM []byte) (kubernetes.NodeCheckpoint, error) {
		t.Helper()
		dir := t.TempDir()
		if err := nodeagent.WriteTLSDir(dir, ccert, caPEM); err != nil {
			t.Fatal(err)
		}
		d, err := nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": addr}, TLSDir: dir, RunnerID: "runner-a"}.Dialer(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ag, err := d.Agent(ctx, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		cp, err := ag.Checkpoint(ctx, kubernetes.NodeCheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "mine"})
		if cause := nodeagentdial.Cause(err); cause != nil {
			err = cause // the handshake's own error (the backend gets a fixed sentence)
		}
		return cp, err
	}
	// The genuine agent reached with the right ca.crt works (the baseline).
	if cp, err := checkpoint(a.addr, a.ca.CertPEM()); err != nil || cp.ID == "" {
		t.Fatalf("genuine agent: %+v %v", cp, err)
	}
	calls := len(a.ckpt.calls)
	// The genuine agent, but the runner's ca.crt is another CA.
	var unknown x509.UnknownAuthorityError
	if _, err := checkpoint(a.addr, otherCA.CertPEM()); !errors.As(err, &unknown) {
		t.Errorf("agent not of the runner's CA: %v, want x509.UnknownAuthorityError", err)
	}
	if len(a.ckpt.calls) != calls {
		t.Errorf("the agent checkpointed for a runner that does not trust it: %v", a.ckpt.calls)
	}

	issue := func(c tls.Certificate, err error) tls.Certificate {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	foreignID := store.NewID("runner-b")
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	for name, tc := range map[string]struct {
		cert tls.Certificate
		ok   func(error) bool
	}{
		"attacker CA for the agents' name": {issue(otherCA.IssueServer("node-agent", []string{nodeagent.ServerName}, nil, time.Hour)),
			func(err error) bool { return errors.As(err, &unknown) }},
		"right CA, another name": {issue(a.ca.IssueServer("impostor", []string{"other.sandboxd.internal"}, nil, time.Hour)),
			func(err error) bool { return errors.As(err, &hostname) }},
		"a runner's client certificate": {issue(a.ca.IssueClient("runner-b", []*url.URL{pki.NodeAgentClientURI("runner-b")}, time.Hour)),
			func(err error) bool { return errors.As(err, &hostname) }},
		"clientAuth certificate naming the agents": {secClientCertNamed(t, a.ca, nodeagent.ServerName),
			func(err error) bool { return errors.As(err, &invalid) && invalid.Reason == x509.IncompatibleUsage }},
	} {
		addr, hit := impostorAgent(t, tc.cert, store.NewID("runner-a"))
		cp, err := checkpoint(addr, a.ca.CertPEM())
		if !tc.ok(err) || cp.ID != "" {
			t.Errorf("%s: %+v %v, want the handshake refused", name, cp, err)
		}
		if hit.Load() != 0 {
			t.Errorf("%s: the impostor received %d requests", name, hit.Load())
		}
	}
	// A genuine agent certificate (a compromised node) answering another runner's ID.
	addr, hit := impostorAgent(t, issue(a.ca.IssueServer("node-agent", []string{nodeagent.ServerName}, nil, time.Hour)), foreignID)
	if cp, err := checkpoint(addr, a.ca.CertPEM()); err == nil || cp.ID != "" || hit.Load() != 1 {
		t.Errorf("agent answering runner-b's checkpoint %s: %+v %v (requests %d), want an error and no ID", foreignID, cp, err, hit.Load())
	}
}

// secClientCertNamed is a clientAuth-only certificate of ca carrying the DNS name name.
func secClientCertNamed(t *testing.T, ca *pki.CA, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.SignCSR(csr, func(c *x509.Certificate) {
		c.DNSNames = []string{name}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}
