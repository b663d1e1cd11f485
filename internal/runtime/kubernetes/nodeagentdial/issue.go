package nodeagentdial

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// The runner issues its node agents' certificates itself (--node-agent-issue-secrets,
// docs/nodeagent.md "Certificates the runner issues"): a CA of its own, dedicated to this
// runner's node agents, kept in one Secret only the runner reads, and the agents' server
// certificate in a kubernetes.io/tls Secret (with ca.crt) that the agents' DaemonSet
// mounts. The runner's client certificate is never stored: it is issued in memory from the
// CA (ClientCertTTL, renewed at half its life).

const (
	// ServerCertTTL is the lifetime of an issued server certificate of the agents.
	ServerCertTTL = 90 * 24 * time.Hour
	// ClientCertTTL is the lifetime of the runner's in-memory client certificate (renewed
	// at half its life).
	ClientCertTTL = 7 * 24 * time.Hour
	// RenewBefore: a server certificate (at start and on each check) or the CA (at start)
	// valid for less than this is issued anew.
	RenewBefore = 30 * 24 * time.Hour
	// RenewCheckInterval is how often a running runner checks the two Secrets (Held.Check).
	RenewCheckInterval = time.Hour
	// MaxSecretValueBytes bounds each value read from the two Secrets (a PEM certificate
	// or key is ~1 KiB): a larger one is refused before it is parsed.
	MaxSecretValueBytes = 16 << 10

	// CAKeyFile is the CA Secret's private key (its certificate is nodeagent.CAFile).
	CAKeyFile = "ca.key"

	// LabelManagedBy marks the Secrets a runner issued; LabelRunnerID names the runner.
	// A Secret of the configured name without LabelManagedBy is never overwritten.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedByValue = "sandboxd-runner"
	LabelRunnerID  = "sandboxd.io/runner-id"
)

// caCommonName is the common name of a runner's node-agent CA.
const caCommonName = "sandboxd node-agent CA"

// IssueConfig names the two Secrets, in Namespace, that the runner keeps its node agents'
// certificates in: CASecret (Opaque: ca.crt, ca.key; only the runner reads it) and
// ServerSecret (kubernetes.io/tls: tls.crt, tls.key for nodeagent.ServerName, and ca.crt:
// what the agents' --tls-dir holds).
type IssueConfig struct {
	Namespace, CASecret, ServerSecret string
}

// IssueSecretNames are the Secrets --node-agent-issue-secrets=prefix names: prefix-ca and
// prefix-server.
func IssueSecretNames(prefix string) (ca, server string) {
	return prefix + "-ca", prefix + "-server"
}

// Validate checks the names (pure).
func (c IssueConfig) Validate() error {
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return fmt.Errorf("node agent certificates: namespace %q: %v", c.Namespace, errs)
	}
	for _, n := range []string{c.CASecret, c.ServerSecret} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return fmt.Errorf("node agent certificates: Secret name %q: %v", n, errs)
		}
	}
	if c.CASecret == c.ServerSecret {
		return fmt.Errorf("node agent certificates: the CA and the server certificate are two Secrets, both named %q", c.CASecret)
	}
	return nil
}

// Issuer creates or loads the Secrets of an IssueConfig for RunnerID.
type Issuer struct {
	Client   k8s.Interface
	Config   IssueConfig
	RunnerID string
	Log      *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (is *Issuer) now() time.Time {
	if is.Now != nil {
		return is.Now()
	}
	return time.Now()
}

func (is *Issuer) log() *slog.Logger {
	if is.Log != nil {
		return is.Log
	}
	return slog.Default()
}

func (is *Issuer) secrets() interface {
	Get(context.Context, string, metav1.GetOptions) (*corev1.Secret, error)
	Create(context.Context, *corev1.Secret, metav1.CreateOptions) (*corev1.Secret, error)
	Update(context.Context, *corev1.Secret, metav1.UpdateOptions) (*corev1.Secret, error)
} {
	return is.Client.CoreV1().Secrets(is.Config.Namespace)
}

// Ensure makes both Secrets what they must be and returns the CA: the CA Secret is loaded
// when it holds a valid CA of this runner, valid for RenewBefore at least, and issued anew
// otherwise; then EnsureServer. A Secret of either name that the runner did not make (no
// LabelManagedBy) is an error, never overwritten; one it made that cannot be used (another
// runner's, bad data, expiring) is replaced, with a warning saying why.
func (is *Issuer) Ensure(ctx context.Context) (*pki.CA, error) {
	if err := is.Config.Validate(); err != nil {
		return nil, err
	}
	if is.RunnerID == "" {
		return nil, errors.New("node agent certificates: the runner's ID")
	}
	ca, err := is.ensureCA(ctx)
	if err != nil {
		return nil, err
	}
	if err := is.EnsureServer(ctx, ca); err != nil {
		return nil, err
	}
	return ca, nil
}

func (is *Issuer) ensureCA(ctx context.Context) (*pki.CA, error) {
	var ca *pki.CA
	err := is.ensureSecret(ctx, is.Config.CASecret, corev1.SecretTypeOpaque, "a new CA",
		func(s *corev1.Secret) (why string) {
			ca, why = is.checkCA(s)
			return why
		},
		func() (map[string][]byte, error) {
			c, keyPEM, err := pki.NewCA(caCommonName)
			if err != nil {
				return nil, err
			}
			ca = c
			return map[string][]byte{nodeagent.CAFile: c.CertPEM(), CAKeyFile: keyPEM}, nil
		})
	if err != nil {
		return nil, err
	}
	return ca, nil
}

// EnsureServer makes the server Secret hold a certificate of ca for nodeagent.ServerName
// valid for RenewBefore at least, and ca's certificate as ca.crt.
func (is *Issuer) EnsureServer(ctx context.Context, ca *pki.CA) error {
	return is.ensureSecret(ctx, is.Config.ServerSecret, corev1.SecretTypeTLS, "a new server certificate",
		func(s *corev1.Secret) string { return is.checkServer(s, ca) },
		func() (map[string][]byte, error) {
			cert, err := ca.IssueServer("sandboxd-node-agent", []string{nodeagent.ServerName}, nil, ServerCertTTL)
			if err != nil {
				return nil, err
			}
			chain, keyPEM, err := pki.EncodeKeyPair(cert)
			if err != nil {
				return nil, err
			}
			return map[string][]byte{nodeagent.CertFile: chain, nodeagent.KeyFile: keyPEM, nodeagent.CAFile: ca.CertPEM()}, nil
		})
}

// ensureSecret is the one loop of both Secrets: Secret name (of type typ) is kept when
// check finds nothing wrong with it ("": usable); otherwise (or when there is none) issue
// makes its data anew (what: said in the warning) and it is written. Another replica
// writing it first (AlreadyExists, Conflict) is met once by reading and checking again.
func (is *Issuer) ensureSecret(ctx context.Context, name string, typ corev1.SecretType, what string,
	check func(*corev1.Secret) string, issue func() (map[string][]byte, error)) error {
	for attempt := 0; ; attempt++ {
		cur, err := is.get(ctx, name)
		if err != nil {
			return err
		}
		if cur != nil {
			why := check(cur)
			if why == "" {
				return nil
			}
			is.log().Warn("node agent certificates: issuing "+what, "secret", is.Config.Namespace+"/"+name, "reason", why)
		}
		data, err := issue()
		if err != nil {
			return fmt.Errorf("node agent certificates: %w", err)
		}
		err = is.put(ctx, cur, name, typ, data)
		if err == nil {
			return nil
		}
		if attempt == 0 && (apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)) {
			continue // another replica wrote it first: load that one
		}
		return err
	}
}

// get reads Secret name (nil, nil: there is none); one the runner did not make is an error.
func (is *Issuer) get(ctx context.Context, name string) (*corev1.Secret, error) {
	s, err := is.secrets().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node agent certificates: read Secret %s/%s: %w", is.Config.Namespace, name, err)
	}
	if s.Labels[LabelManagedBy] != managedByValue {
		return nil, fmt.Errorf("node agent certificates: Secret %s/%s exists and the runner did not make it (no label %s=%s): it is never overwritten; delete it, or name both Secrets yourself (--node-agent-tls-dir, the chart's nodeAgent.serverSecret and nodeAgent.clientSecret)",
			is.Config.Namespace, name, LabelManagedBy, managedByValue)
	}
	return s, nil
}

// put creates Secret name (cur nil) or replaces cur's data.
func (is *Issuer) put(ctx context.Context, cur *corev1.Secret, name string, typ corev1.SecretType, data map[string][]byte) error {
	labels := map[string]string{LabelManagedBy: managedByValue, LabelRunnerID: is.RunnerID}
	if cur == nil {
		_, err := is.secrets().Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: is.Config.Namespace, Labels: labels},
			Type:       typ, Data: data,
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node agent certificates: create Secret %s/%s: %w", is.Config.Namespace, name, err)
		}
		return nil
	}
	if cur.Type != typ {
		// A Secret's type cannot change: not the runner's doing, never deleted here.
		return fmt.Errorf("node agent certificates: Secret %s/%s is of type %s, want %s: delete it (the runner makes it anew)", is.Config.Namespace, name, cur.Type, typ)
	}
	s := cur.DeepCopy()
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	for k, v := range labels {
		s.Labels[k] = v
	}
	s.Data = data
	if _, err := is.secrets().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node agent certificates: update Secret %s/%s: %w", is.Config.Namespace, name, err)
	}
	return nil
}

// values reads the keys of s, each present and at most MaxSecretValueBytes ("" or why not).
func values(s *corev1.Secret, keys ...string) ([][]byte, string) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, ok := s.Data[k]
		switch {
		case !ok || len(v) == 0:
			return nil, fmt.Sprintf("it has no %s", k)
		case len(v) > MaxSecretValueBytes:
			return nil, fmt.Sprintf("its %s is %d bytes, at most %d", k, len(v), MaxSecretValueBytes)
		}
		out[i] = v
	}
	return out, ""
}

// checkCA is the CA in s, or why it is not to be used ("" with a CA).
func (is *Issuer) checkCA(s *corev1.Secret) (*pki.CA, string) {
	if id := s.Labels[LabelRunnerID]; id != is.RunnerID {
		return nil, fmt.Sprintf("it is the CA of runner %q, this runner is %q", id, is.RunnerID)
	}
	v, why := values(s, nodeagent.CAFile, CAKeyFile)
	if why != "" {
		return nil, why
	}
	ca, err := pki.ParseCA(v[0], v[1])
	if err != nil {
		return nil, err.Error()
	}
	if left := ca.Certificate().NotAfter.Sub(is.now()); left < RenewBefore {
		return nil, fmt.Sprintf("the CA expires at %s, within %s", ca.Certificate().NotAfter.UTC().Format(time.RFC3339), RenewBefore)
	}
	return ca, ""
}

// checkServer: why s does not hold a usable server certificate of ca ("": it does).
func (is *Issuer) checkServer(s *corev1.Secret, ca *pki.CA) string {
	if id := s.Labels[LabelRunnerID]; id != is.RunnerID {
		return fmt.Sprintf("it is runner %q's, this runner is %q", id, is.RunnerID)
	}
	v, why := values(s, nodeagent.CertFile, nodeagent.KeyFile, nodeagent.CAFile)
	if why != "" {
		return why
	}
	if !bytes.Equal(v[2], ca.CertPEM()) {
		return "its ca.crt is not the runner's node-agent CA"
	}
	kp, err := tls.X509KeyPair(v[0], v[1])
	if err != nil {
		return fmt.Sprintf("tls.crt and tls.key: %v", err)
	}
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return fmt.Sprintf("tls.crt: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		DNSName: nodeagent.ServerName, Roots: ca.Pool(), CurrentTime: is.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Sprintf("tls.crt is no server certificate of the CA for %s: %v", nodeagent.ServerName, err)
	}
	if left := leaf.NotAfter.Sub(is.now()); left < RenewBefore {
		return fmt.Sprintf("tls.crt expires at %s, within %s", leaf.NotAfter.UTC().Format(time.RFC3339), RenewBefore)
	}
	return ""
}

// Held is the CA a running process of the runner uses for its node agents: what its
// client certificate is issued from and the only root of the agents' certificates
// (ClientTLS), and what Check keeps the server Secret of. Another process of the same
// runner (two replicas during a rolling update with leader election off) may have issued
// another CA at its start: Check then takes the CA Secret's, for the client too, rather
// than both rewriting the server Secret with their own.
type Held struct {
	is *Issuer

	mu      sync.Mutex
	ca      *pki.CA
	cert    func() (*tls.Certificate, error) // pki.Renewing of ca's client certificates
	pool    *x509.CertPool                   // ca's
	skipped string                           // why the CA Secret was last not used ("": it was)
}

// Hold starts using ca (from Ensure): its first client certificate is issued here.
func (is *Issuer) Hold(ca *pki.CA) (*Held, error) {
	h := &Held{is: is}
	if err := h.use(ca); err != nil {
		return nil, err
	}
	return h, nil
}

// use makes ca the held CA once a client certificate of it is issued.
func (h *Held) use(ca *pki.CA) error {
	get := pki.Renewing(func() (tls.Certificate, error) {
		return ca.IssueClient("runner-"+h.is.RunnerID, []*url.URL{pki.NodeAgentClientURI(h.is.RunnerID)}, ClientCertTTL)
	})
	if _, err := get(); err != nil {
		return fmt.Errorf("node agent certificates: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ca, h.cert, h.pool = ca, get, ca.Pool()
	return nil
}

// CA is the CA in use.
func (h *Held) CA() *pki.CA {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ca
}

// ClientTLS is the runner's TLS configuration for its agents: a client certificate naming
// RunnerID (pki.NodeAgentClientURI), issued in memory from the held CA and renewed at
// half its life (ClientCertTTL), and the held CA as the only root of the agents'
// certificates (for nodeagent.ServerName). Both follow the CA Check takes.
func (h *Held) ClientTLS() *tls.Config {
	c := nodeagent.ClientTLSConfig(nil, func() (*tls.Certificate, error) {
		h.mu.Lock()
		get := h.cert
		h.mu.Unlock()
		return get()
	}, nil)
	// The roots change with the held CA, which a tls.Config's RootCAs cannot: the
	// agent's chain is verified here instead, as the standard verification would
	// (crypto/tls's VerifyConnection example), against the CA held now.
	c.InsecureSkipVerify = true //nolint:gosec // verified in VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("node agent: no server certificate")
		}
		h.mu.Lock()
		roots := h.pool
		h.mu.Unlock()
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			DNSName: nodeagent.ServerName, Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		return err
	}
	return c
}

// Check is one of Maintain's checks (not for concurrent use): the CA Secret is read
// again; when it holds a usable CA of this runner (Ensure's test) other than the one
// held, that one is held from now on (logged; the client certificate is issued from it);
// then EnsureServer with the held CA. A CA Secret that is gone or not usable is never
// replaced here, and the server Secret is then left as it is (logged once per reason):
// a runner's start issues a new CA.
func (h *Held) Check(ctx context.Context) error {
	is := h.is
	cur, err := is.get(ctx, is.Config.CASecret)
	if err != nil {
		return err
	}
	why := "there is none"
	var ca *pki.CA
	if cur != nil {
		ca, why = is.checkCA(cur)
	}
	if why != "" {
		if why != h.skipped {
			is.log().Warn("node agent certificates: the CA Secret cannot be used; the server Secret is left as it is until a runner's start issues a new CA",
				"secret", is.Config.Namespace+"/"+is.Config.CASecret, "reason", why)
		}
		h.skipped = why
		return nil
	}
	h.skipped = ""
	if !bytes.Equal(ca.CertPEM(), h.CA().CertPEM()) {
		if err := h.use(ca); err != nil {
			return err
		}
		is.log().Warn("node agent certificates: the CA Secret holds another CA (another process of this runner issued it): this process uses it from now on",
			"secret", is.Config.Namespace+"/"+is.Config.CASecret)
	}
	return is.EnsureServer(ctx, ca)
}

// Maintain runs Check every interval until ctx ends (EnsureServer: a certificate within
// RenewBefore of its end, or a Secret changed or deleted, is issued anew; the agents
// re-read their files when the kubelet updates the Secret's volume). A failure is logged
// and tried again at the next check.
func (h *Held) Maintain(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.Check(ctx); err != nil && ctx.Err() == nil {
			h.is.log().Error("node agent certificates: the server Secret's check failed; tried again in "+interval.String(), "err", err)
		}
	}
}
