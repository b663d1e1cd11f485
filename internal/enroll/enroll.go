// Package enroll is the runner's side of registration and heartbeats: it trades a
// one-time bootstrap token for the runner's certificate (its key never leaves the data
// dir), keeps those credentials for every later start, heartbeats the control plane over
// mTLS and caches the policy each reply carries, in memory and on disk, so the runner
// keeps enforcing its last-known policy while the control plane is unreachable.
//
// Files (DIR is the runner's data dir): DIR/identity/runner.pem and runner-key.pem (0600)
// — the certificate, client and server; DIR/identity/ca.pem — the platform CA;
// DIR/identity/identity.json — organization, runner ID and control-plane address;
// DIR/identity/policy.json — the last policy received.
package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/atomicfile"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
)

const (
	identityDir  = "identity"
	certName     = "runner"
	caFile       = "ca.pem"
	identityFile = "identity.json"
	policyFile   = "policy.json"
)

// ErrNotRegistered: the data dir holds no credentials.
var ErrNotRegistered = errors.New("runner not registered")

// Identity is a registered runner's credentials.
type Identity struct {
	Org          string `json:"org"`
	RunnerID     string `json:"runner_id"`
	ControlPlane string `json:"control_plane"` // host:port

	Cert  tls.Certificate   `json:"-"`
	CAs   *x509.CertPool    `json:"-"`
	CAPEM []byte            `json:"-"`
	CA    *x509.Certificate `json:"-"`
}

// Dir is where the credentials of the runner with data dir dataDir live.
func Dir(dataDir string) string { return filepath.Join(dataDir, identityDir) }

// Load reads the credentials saved in dataDir; errors.Is(err, ErrNotRegistered) when
// there are none.
func Load(dataDir string) (*Identity, error) {
	dir := Dir(dataDir)
	b, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: no %s", ErrNotRegistered, filepath.Join(dir, identityFile))
	}
	if err != nil {
		return nil, err
	}
	id := &Identity{}
	if err := json.Unmarshal(b, id); err != nil {
		return nil, fmt.Errorf("%s: %w", identityFile, err)
	}
	if id.Cert, err = pki.LoadKeyPair(dir, certName); err != nil {
		return nil, err
	}
	if id.CAPEM, err = os.ReadFile(filepath.Join(dir, caFile)); err != nil {
		return nil, err
	}
	if err := id.setCAs(); err != nil {
		return nil, err
	}
	return id, nil
}

func (id *Identity) setCAs() error {
	id.CAs = x509.NewCertPool()
	rest := id.CAPEM
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("CA bundle: %w", err)
		}
		if id.CA == nil {
			id.CA = c
		}
		id.CAs.AddCert(c)
	}
	if id.CA == nil {
		return errors.New("CA bundle holds no certificate")
	}
	return nil
}

// Register trades token for credentials at the control plane controlPlane (host:port)
// and saves them in dataDir. caPEM, when set, is the CA to trust the control plane by;
// otherwise the token's CA pin decides.
func Register(ctx context.Context, dataDir, controlPlane, token string, caPEM []byte) (*Identity, error) {
	tok, err := controlplane.ParseBootstrapToken(token)
	if err != nil {
		return nil, fmt.Errorf("bootstrap token: %w", err)
	}
	tlsCfg, err := registrationTLS(controlPlane, tok.CAPin, caPEM)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "sandboxd runner"}}, key)
	if err != nil {
		return nil, err
	}
	hc := httpClient(tlsCfg)
	defer hc.CloseIdleConnections()
	c := controlplanev1connect.NewRunnerRegistrationServiceClient(hc, "https://"+controlPlane)
	res, err := c.Register(ctx, connect.NewRequest(&controlplanev1.RegisterRequest{
		BootstrapToken: token,
		CsrPem:         string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
	}))
	if err != nil {
		return nil, fmt.Errorf("register at %s: %w", controlPlane, err)
	}
	id := &Identity{Org: res.Msg.GetOrg(), RunnerID: res.Msg.GetRunnerId(), ControlPlane: controlPlane, CAPEM: []byte(res.Msg.GetCaBundlePem())}
	if err := id.setCAs(); err != nil {
		return nil, err
	}
	cert := tls.Certificate{PrivateKey: key}
	rest := []byte(res.Msg.GetCertificateChainPem())
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		cert.Certificate = append(cert.Certificate, blk.Bytes)
	}
	if len(cert.Certificate) == 0 {
		return nil, errors.New("register: the control plane returned no certificate")
	}
	if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return nil, fmt.Errorf("register: certificate: %w", err)
	}
	if !key.PublicKey.Equal(cert.Leaf.PublicKey) {
		return nil, errors.New("register: the certificate is not for this runner's key")
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: id.CAs, DNSName: id.RunnerID, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("register: certificate: %w", err)
	}
	id.Cert = cert
	if err := id.save(dataDir); err != nil {
		return nil, err
	}
	return id, nil
}

func (id *Identity) save(dataDir string) error {
	dir := Dir(dataDir)
	if err := pki.WriteKeyPair(dir, certName, id.Cert); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, caFile), id.CAPEM, 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	// Last: its presence means the rest is complete.
	return writeAtomic(filepath.Join(dir, identityFile), append(b, '\n'), 0o600)
}

// LoadOrRegister loads the saved credentials, or registers with token when there are
// none. The token is not needed (nor used) once registered.
func LoadOrRegister(ctx context.Context, dataDir, controlPlane, token string, caPEM []byte) (id *Identity, registered bool, err error) {
	id, err = Load(dataDir)
	if err == nil {
		if controlPlane != "" && controlPlane != id.ControlPlane {
			id.ControlPlane = controlPlane
		}
		return id, false, nil
	}
	if !errors.Is(err, ErrNotRegistered) {
		return nil, false, fmt.Errorf("saved runner credentials in %s: %w", Dir(dataDir), err)
	}
	if token == "" {
		return nil, false, fmt.Errorf("this runner is not registered yet (%s is empty): start it with --bootstrap-token (from POST /v1/sandbox/managedRunners/RUNNER_ID:createBootstrapToken)", Dir(dataDir))
	}
	if controlPlane == "" {
		return nil, false, errors.New("--control-plane is required to register")
	}
	id, err = Register(ctx, dataDir, controlPlane, token, caPEM)
	return id, err == nil, err
}

// registrationTLS trusts the control plane by caPEM, else by the CA pin: the server's
// chain must include a certificate hashing to the pin, and the leaf must verify against it.
func registrationTLS(controlPlane, pin string, caPEM []byte) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(controlPlane)
	if err != nil {
		return nil, fmt.Errorf("control plane address %q: %w", controlPlane, err)
	}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("control plane CA: no PEM certificate")
		}
		return pki.ClientTLSConfig(nil, pool, host), nil
	}
	if pin == "" {
		return nil, errors.New("the bootstrap token has no CA pin: pass the control plane's CA certificate")
	}
	cfg := pki.ClientTLSConfig(nil, nil, host)
	cfg.InsecureSkipVerify = true // verified below, against the pinned CA
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("control plane sent no certificate")
		}
		pool := x509.NewCertPool()
		found := false
		for _, c := range cs.PeerCertificates[1:] {
			if controlplane.CAPin(c) == pin {
				pool.AddCert(c)
				found = true
			}
		}
		if !found {
			return errors.New("control plane's CA does not match the bootstrap token's CA pin")
		}
		inter := x509.NewCertPool()
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: host})
		return err
	}
	return cfg, nil
}

func httpClient(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, IdleConnTimeout: time.Minute}}
}

func writeAtomic(p string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, data, perm)
}

func splitHost(hostport string) (string, string, error) { return net.SplitHostPort(hostport) }
