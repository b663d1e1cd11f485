package nodeagentdial_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

const issueNS = "sandboxd-r1"

var issueCfg = nodeagentdial.IssueConfig{Namespace: issueNS, CASecret: "na-ca", ServerSecret: "na-server"}

func newIssuer(t *testing.T, cs *fake.Clientset, runnerID string) (*nodeagentdial.Issuer, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	return &nodeagentdial.Issuer{Client: cs, Config: issueCfg, RunnerID: runnerID, Log: slog.New(slog.NewTextHandler(&log, nil))}, &log
}

func getSecret(t *testing.T, cs *fake.Clientset, name string) *corev1.Secret {
	t.Helper()
	s, err := cs.CoreV1().Secrets(issueNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveAgent writes the server Secret's data as the agent's --tls-dir (what the
// DaemonSet's Secret volume holds) and serves one TLS handshake with the agent's own
// configuration (nodeagent.ServerTLSConfig) for runnerID; it returns the address.
func serveAgent(t *testing.T, s *corev1.Secret, runnerID string) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range s.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := nodeagent.ServerTLSConfig(dir, runnerID)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return l.Addr().String()
}

func clientTLS(is *nodeagentdial.Issuer, ca *pki.CA) (*tls.Config, error) {
	h, err := is.Hold(ca)
	if err != nil {
		return nil, err
	}
	return h.ClientTLS(), nil
}

func handshake(addr string, tc *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return err
	}
	defer c.Close()
	// TLS 1.3: the server's verdict on the client certificate arrives with the first read.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if err != nil && strings.Contains(err.Error(), "EOF") {
		return nil
	}
	return err
}

// TestIssuerCreate: with no Secrets, Ensure makes the CA Secret (Opaque, ca.crt and
// ca.key) and the server Secret (kubernetes.io/tls: tls.crt for node-agent.sandboxd.internal
// of that CA, tls.key, ca.crt), both labelled as the runner's; the agent's own TLS
// configuration serves the server Secret's files and takes the runner's in-memory client
// certificate (ClientTLS), and refuses one of another runner's issuer.
func TestIssuerCreate(t *testing.T) {
	cs := fake.NewClientset()
	is, _ := newIssuer(t, cs, "runner-a")
	ca, err := is.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cas := getSecret(t, cs, "na-ca")
	if cas.Type != corev1.SecretTypeOpaque || !bytes.Equal(cas.Data[nodeagent.CAFile], ca.CertPEM()) || len(cas.Data[nodeagentdial.CAKeyFile]) == 0 {
		t.Errorf("CA Secret: type %s, keys %v", cas.Type, keys(cas))
	}
	srv := getSecret(t, cs, "na-server")
	if srv.Type != corev1.SecretTypeTLS || !bytes.Equal(srv.Data[nodeagent.CAFile], ca.CertPEM()) {
		t.Errorf("server Secret: type %s, keys %v", srv.Type, keys(srv))
	}
	for _, s := range []*corev1.Secret{cas, srv} {
		if s.Labels[nodeagentdial.LabelManagedBy] != "sandboxd-runner" || s.Labels[nodeagentdial.LabelRunnerID] != "runner-a" {
			t.Errorf("Secret %s labels %v", s.Name, s.Labels)
		}
	}
	kp, err := tls.X509KeyPair(srv.Data[nodeagent.CertFile], srv.Data[nodeagent.KeyFile])
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(kp.Certificate[0])
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: nodeagent.ServerName, Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("server certificate: %v", err)
	}
	if d := time.Until(leaf.NotAfter); d < nodeagentdial.ServerCertTTL-time.Hour || d > nodeagentdial.ServerCertTTL {
		t.Errorf("server certificate valid for %s, want %s", d, nodeagentdial.ServerCertTTL)
	}

	tc, err := clientTLS(is, ca)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveAgent(t, srv, "runner-a")
	if err := handshake(addr, tc); err != nil {
		t.Errorf("the runner's issued client certificate against the agent serving the issued Secret: %v", err)
	}
	// Another runner's issuer (its own CA) is refused by this runner's agent, both ways.
	other, _ := newIssuer(t, fake.NewClientset(), "runner-b")
	oca, err := other.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	otc, err := clientTLS(other, oca)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(addr, otc); err == nil {
		t.Error("another runner's client certificate was accepted by runner-a's agent")
	}
}

func keys(s *corev1.Secret) []string {
	var out []string
	for k := range s.Data {
		out = append(out, k)
	}
	return out
}

// TestIssuerLoad: a second Ensure (a restart) loads what the first made: the same CA,
// neither Secret written again.
func TestIssuerLoad(t *testing.T) {
	cs := fake.NewClientset()
	is, _ := newIssuer(t, cs, "runner-a")
	ca1, err := is.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv1 := getSecret(t, cs, "na-server")
	cs.ClearActions()
	ca2, err := is.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !ca1.Certificate().Equal(ca2.Certificate()) {
		t.Error("a second Ensure made a new CA")
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("a second Ensure did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if srv2 := getSecret(t, cs, "na-server"); !bytes.Equal(srv1.Data[nodeagent.CertFile], srv2.Data[nodeagent.CertFile]) {
		t.Error("the server certificate changed")
	}
}

// TestIssuerReissue: a Secret the runner made that cannot be used is replaced, and the
// warning says why: the server Secret of another runner, with another CA's ca.crt, a
// certificate expiring within RenewBefore, bad PEM, a value over the size bound, a key that
// does not match; the CA Secret of another runner or with bad data: a new CA and a new
// server certificate of it.
func TestIssuerReissue(t *testing.T) {
	otherCA, _, err := pki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		secret string
		edit   func(s *corev1.Secret)
		later  time.Duration // the issuer's clock, after the first Ensure
		newCA  bool
		reason string
	}{
		{"server of another runner", "na-server", func(s *corev1.Secret) { s.Labels[nodeagentdial.LabelRunnerID] = "runner-b" }, 0, false, `it is runner "runner-b"'s`},
		{"server ca.crt of another CA", "na-server", func(s *corev1.Secret) { s.Data[nodeagent.CAFile] = otherCA.CertPEM() }, 0, false, "its ca.crt is not the runner's node-agent CA"},
		{"server expiring", "na-server", nil, nodeagentdial.ServerCertTTL - nodeagentdial.RenewBefore + time.Hour, false, "tls.crt expires at"},
		{"server bad PEM", "na-server", func(s *corev1.Secret) { s.Data[nodeagent.CertFile] = []byte("garbage") }, 0, false, "tls.crt and tls.key"},
		{"server key of another certificate", "na-server", func(s *corev1.Secret) {
			c, _ := otherCA.IssueServer("x", []string{nodeagent.ServerName}, nil, time.Hour)
			_, k, _ := pki.EncodeKeyPair(c)
			s.Data[nodeagent.KeyFile] = k
		}, 0, false, "tls.crt and tls.key"},
		{"server certificate of another CA", "na-server", func(s *corev1.Secret) {
			c, _ := otherCA.IssueServer("x", []string{nodeagent.ServerName}, nil, nodeagentdial.ServerCertTTL)
			s.Data[nodeagent.CertFile], s.Data[nodeagent.KeyFile], _ = pki.EncodeKeyPair(c)
		}, 0, false, "tls.crt is no server certificate of the CA"},
		{"server value too large", "na-server", func(s *corev1.Secret) {
			s.Data[nodeagent.CertFile] = bytes.Repeat([]byte("A"), nodeagentdial.MaxSecretValueBytes+1)
		}, 0, false, "its tls.crt is 16385 bytes, at most 16384"},
		{"server missing key", "na-server", func(s *corev1.Secret) { delete(s.Data, nodeagent.KeyFile) }, 0, false, "it has no tls.key"},
		{"CA of another runner", "na-ca", func(s *corev1.Secret) { s.Labels[nodeagentdial.LabelRunnerID] = "runner-b" }, 0, true, `it is the CA of runner "runner-b"`},
		{"CA bad key", "na-ca", func(s *corev1.Secret) {
			s.Data[nodeagentdial.CAKeyFile] = []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
		}, 0, true, "the CA key"},
		{"CA not a CA", "na-ca", func(s *corev1.Secret) {
			c, _ := otherCA.IssueServer("x", []string{"x"}, nil, time.Hour)
			s.Data[nodeagent.CAFile], s.Data[nodeagentdial.CAKeyFile], _ = pki.EncodeKeyPair(c)
		}, 0, true, "is not a CA certificate"},
		{"CA expiring", "na-ca", nil, pki.CAValidity - nodeagentdial.RenewBefore + time.Hour, true, "the CA expires at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			is, log := newIssuer(t, cs, "runner-a")
			ca1, err := is.Ensure(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			srv1 := getSecret(t, cs, "na-server")
			if tc.edit != nil {
				s := getSecret(t, cs, tc.secret)
				tc.edit(s)
				if _, err := cs.CoreV1().Secrets(issueNS).Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.later != 0 {
				is.Now = func() time.Time { return time.Now().Add(tc.later) }
			}
			ca2, err := is.Ensure(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.ReplaceAll(log.String(), `\"`, `"`), tc.reason) {
				t.Errorf("log %q, want the reason %q", log.String(), tc.reason)
			}
			if got := !ca1.Certificate().Equal(ca2.Certificate()); got != tc.newCA {
				t.Errorf("new CA %v, want %v", got, tc.newCA)
			}
			// Whatever was replaced, both Secrets are again this runner's and usable.
			is.Now = nil
			log.Reset()
			if _, err := is.Ensure(t.Context()); err != nil {
				t.Fatal(err)
			}
			if log.Len() != 0 {
				t.Errorf("a third Ensure re-issued: %s", log.String())
			}
			srv2 := getSecret(t, cs, "na-server")
			if bytes.Equal(srv1.Data[nodeagent.CertFile], srv2.Data[nodeagent.CertFile]) {
				t.Error("the server certificate was not issued anew")
			}
			if srv2.Labels[nodeagentdial.LabelRunnerID] != "runner-a" || !bytes.Equal(srv2.Data[nodeagent.CAFile], ca2.CertPEM()) {
				t.Errorf("server Secret after the re-issue: labels %v", srv2.Labels)
			}
		})
	}
}

// TestIssuerRefusesForeign: a Secret of either name the runner did not make (no
// managed-by label) is an error naming it, and it is left as it was; a Secret of the
// runner's of the wrong type (which cannot change) is an error too.
func TestIssuerRefusesForeign(t *testing.T) {
	for _, name := range []string{"na-ca", "na-server"} {
		mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: issueNS}, Data: map[string][]byte{"x": []byte("operator's")}}
		cs := fake.NewClientset(mine)
		is, _ := newIssuer(t, cs, "runner-a")
		_, err := is.Ensure(t.Context())
		if err == nil || !strings.Contains(err.Error(), "Secret "+issueNS+"/"+name+" exists and the runner did not make it") {
			t.Errorf("%s: %v, want the foreign Secret refused", name, err)
		}
		if s := getSecret(t, cs, name); string(s.Data["x"]) != "operator's" || len(s.Data) != 1 {
			t.Errorf("%s was changed: %v", name, keys(s))
		}
	}
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "na-server", Namespace: issueNS,
		Labels: map[string]string{nodeagentdial.LabelManagedBy: "sandboxd-runner", nodeagentdial.LabelRunnerID: "runner-a"}}, Type: corev1.SecretTypeOpaque})
	is, _ := newIssuer(t, cs, "runner-a")
	if _, err := is.Ensure(t.Context()); err == nil || !strings.Contains(err.Error(), "is of type Opaque, want kubernetes.io/tls") {
		t.Errorf("wrong type: %v", err)
	}
}

// TestIssuerRace: when another replica creates the CA Secret between this one's read and
// its create (AlreadyExists), this one loads that CA instead of failing.
func TestIssuerRace(t *testing.T) {
	cs := fake.NewClientset()
	winner, _ := newIssuer(t, fake.NewClientset(), "runner-a")
	wca, err := winner.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	won := getSecret(t, winner.Client.(*fake.Clientset), "na-ca")
	won.ResourceVersion = ""
	first := true
	cs.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !first || a.(k8stesting.CreateAction).GetObject().(*corev1.Secret).Name != "na-ca" {
			return false, nil, nil
		}
		first = false
		if err := cs.Tracker().Create(corev1.SchemeGroupVersion.WithResource("secrets"), won, issueNS); err != nil {
			t.Error(err)
		}
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), "na-ca")
	})
	is, _ := newIssuer(t, cs, "runner-a")
	ca, err := is.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Certificate().Equal(wca.Certificate()) {
		t.Error("the loser of the race did not load the winner's CA")
	}
}

// TestDialerIssue: DialConfig with Issue (--node-agent-issue-secrets) makes the Secrets
// through the client it is given, and its dialer checkpoints through a real agent served
// from the server Secret's files, with the runner's in-memory certificate.
func TestDialerIssue(t *testing.T) {
	cs := fake.NewClientset()
	cfg := issueCfg
	// Validate refuses Issue with TLSDir, and without a client there is nothing to keep
	// the Secrets in.
	if err := (nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": "127.0.0.1:1"}, Issue: &cfg, TLSDir: "/x"}).Validate(); err == nil {
		t.Error("Issue with TLSDir accepted")
	}
	if _, err := (nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": "127.0.0.1:1"}, Issue: &cfg, RunnerID: joinRunner}).Dialer(t.Context(), nil); err == nil {
		t.Error("Issue without a Kubernetes client accepted")
	}
	// The runner's start issues; the agent then serves the Secret the DaemonSet mounts.
	is := &nodeagentdial.Issuer{Client: cs, Config: cfg, RunnerID: joinRunner}
	if _, err := is.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for k, v := range getSecret(t, cs, "na-server").Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	j := serveJoinAgentTLS(t, dir)
	d, err := nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": j.addr}, Issue: &cfg, RunnerID: joinRunner}.Dialer(t.Context(), cs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Agent(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if cp, err := a.Checkpoint(t.Context(), joinReq(false)); err != nil || cp.Node != "node-1" {
		t.Fatalf("checkpoint with the issued certificates: %+v %v", cp, err)
	}
}

// TestIssueConfigValidate: bad names are refused naming them.
func TestIssueConfigValidate(t *testing.T) {
	for _, c := range []nodeagentdial.IssueConfig{
		{Namespace: "", CASecret: "a", ServerSecret: "b"},
		{Namespace: "ns", CASecret: "A_", ServerSecret: "b"},
		{Namespace: "ns", CASecret: "a", ServerSecret: "a"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := issueCfg.Validate(); err != nil {
		t.Error(err)
	}
}

// TestHeldCheck: two processes of one runner with two CAs (B started while the CA Secret
// was gone and issued its own). A's check (Held.Check, Maintain's round, called here
// directly) takes the CA Secret's CA instead of rewriting the server Secret with its own:
// the server Secret stays B's, A's client now has B's CA (its client certificate and the
// agents' root: it handshakes with an agent serving B's Secret, and refuses one serving
// the certificate of its old CA), logged once. A CA Secret that is gone is never replaced
// by a check, nor the server Secret rewritten (logged once).
func TestHeldCheck(t *testing.T) {
	cs := fake.NewClientset()
	a, alog := newIssuer(t, cs, "runner-a")
	caA, err := a.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	heldA, err := a.Hold(caA)
	if err != nil {
		t.Fatal(err)
	}
	tcA := heldA.ClientTLS()
	srvA := getSecret(t, cs, "na-server")
	oldAgent := serveAgent(t, srvA, "runner-a")
	if err := handshake(oldAgent, tcA); err != nil {
		t.Fatalf("A against the agent of A's CA: %v", err)
	}

	if err := cs.CoreV1().Secrets(issueNS).Delete(t.Context(), "na-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b, _ := newIssuer(t, cs, "runner-a")
	caB, err := b.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if caB.Certificate().Equal(caA.Certificate()) {
		t.Fatal("B did not issue a CA of its own")
	}
	srvB := getSecret(t, cs, "na-server")

	const adopted = "holds another CA"
	for i := range 2 {
		cs.ClearActions()
		if err := heldA.Check(t.Context()); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		for _, act := range cs.Actions() {
			if act.GetVerb() != "get" {
				t.Errorf("check %d did %s %s", i, act.GetVerb(), act.GetResource().Resource)
			}
		}
		if s := getSecret(t, cs, "na-server"); !bytes.Equal(s.Data[nodeagent.CertFile], srvB.Data[nodeagent.CertFile]) || !bytes.Equal(s.Data[nodeagent.CAFile], caB.CertPEM()) {
			t.Errorf("check %d rewrote B's server Secret", i)
		}
	}
	if !heldA.CA().Certificate().Equal(caB.Certificate()) {
		t.Error("A still holds its own CA")
	}
	if n := strings.Count(alog.String(), adopted); n != 1 {
		t.Errorf("%q logged %d times, want once; log:\n%s", adopted, n, alog)
	}
	if err := handshake(serveAgent(t, srvB, "runner-a"), tcA); err != nil {
		t.Errorf("A (now B's CA) against the agent serving B's Secret: %v", err)
	}
	if err := handshake(oldAgent, tcA); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("A (now B's CA) against an agent of A's old CA: %v, want the server certificate refused (unknown authority)", err)
	}

	// The held CA's certificate for another name is no agent's.
	wrong, err := caB.IssueServer("not-the-agent", []string{"other.sandboxd.internal"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	chain, key, err := pki.EncodeKeyPair(wrong)
	if err != nil {
		t.Fatal(err)
	}
	wrongSrv := &corev1.Secret{Data: map[string][]byte{nodeagent.CertFile: chain, nodeagent.KeyFile: key, nodeagent.CAFile: caB.CertPEM()}}
	if err := handshake(serveAgent(t, wrongSrv, "runner-a"), tcA); err == nil || !strings.Contains(err.Error(), "certificate is valid for other.sandboxd.internal") {
		t.Errorf("A against a certificate of its CA for another name: %v, want it refused", err)
	}

	// The CA Secret gone: the checks leave everything as it is and say so once.
	if err := cs.CoreV1().Secrets(issueNS).Delete(t.Context(), "na-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	const skipped = "the CA Secret cannot be used"
	for i := range 2 {
		cs.ClearActions()
		if err := heldA.Check(t.Context()); err != nil {
			t.Fatalf("check %d without a CA Secret: %v", i, err)
		}
		for _, act := range cs.Actions() {
			if act.GetVerb() != "get" {
				t.Errorf("check %d without a CA Secret did %s %s", i, act.GetVerb(), act.GetResource().Resource)
			}
		}
	}
	if n := strings.Count(alog.String(), skipped); n != 1 {
		t.Errorf("%q logged %d times, want once; log:\n%s", skipped, n, alog)
	}
	if !heldA.CA().Certificate().Equal(caB.Certificate()) {
		t.Error("the held CA changed without a CA Secret")
	}
	if s := getSecret(t, cs, "na-server"); !bytes.Equal(s.Data[nodeagent.CertFile], srvB.Data[nodeagent.CertFile]) {
		t.Error("a check without a CA Secret rewrote the server Secret")
	}
}
