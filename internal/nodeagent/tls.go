package nodeagent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
)

// ServerName is the DNS name of every node agent's server certificate: the runner dials
// Pod IPs and verifies this name.
const ServerName = "node-agent.sandboxd.internal"

// The files of the agent's TLS directory (a kubernetes.io/tls Secret volume plus the CA).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// ServerTLSConfig is the agent's TLS configuration: TLS 1.3; its certificate and the CA
// are read from dir (CertFile, KeyFile, CAFile) and re-read when a file's mtime or size
// changes (the kubelet updates Secret volumes in place); a client certificate is required,
// must chain to the CA and must carry exactly one pki.NodeAgentClientURI naming runnerID:
// any other is refused at the handshake.
func ServerTLSConfig(dir, runnerID string) (*tls.Config, error) {
	if runnerID == "" {
		return nil, errors.New("nodeagent: a runner ID")
	}
	r := &reloader{dir: dir}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m, err := r.get()
		if err != nil {
			return nil, err
		}
		c := &tls.Config{
			MinVersion:   tls.VersionTLS13,
			NextProtos:   []string{"h2"},
			Certificates: []tls.Certificate{m.cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    m.pool,
			VerifyConnection: func(cs tls.ConnectionState) error {
				return verifyClient(cs, runnerID)
			},
		}
		return c, nil
	}
	return base, nil
}

// verifyClient: the verified leaf names runnerID (and only it).
func verifyClient(cs tls.ConnectionState, runnerID string) error {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return errors.New("nodeagent: no verified client certificate")
	}
	id, ok := pki.NodeAgentRunner(cs.PeerCertificates[0])
	if !ok {
		return errors.New("nodeagent: the client certificate names no runner (spiffe://sandboxd/node-agent-client/<runner-id>)")
	}
	if id != runnerID {
		return fmt.Errorf("nodeagent: the client certificate names runner %q, this agent serves %q", id, runnerID)
	}
	return nil
}

// ClientTLSConfig is a runner's TLS configuration for its agents: its client certificate
// (pki.NodeAgentClientURI), the node-agent CA as the only root, ServerName. cert may be
// nil when getCert is given (a renewing certificate, pki.Renewing).
func ClientTLSConfig(cert *tls.Certificate, getCert func() (*tls.Certificate, error), roots *x509.CertPool) *tls.Config {
	c := pki.ClientTLSConfig(cert, roots, ServerName)
	c.NextProtos = []string{"h2"}
	if getCert != nil {
		c.Certificates = nil
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return getCert() }
	}
	return c
}

// TLSDir is a TLS directory (CertFile, KeyFile, CAFile) re-read when its files change
// (checked at most once a second; while a file is missing or unreadable the last good
// material is kept): what a runner's client of its agents reads its certificate from.
type TLSDir struct{ r *reloader }

// OpenTLSDir reads dir once (an error if it is incomplete or unreadable).
func OpenTLSDir(dir string) (*TLSDir, error) {
	r := &reloader{dir: dir}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	return &TLSDir{r: r}, nil
}

// Load is the directory's current certificate and CA pool.
func (d *TLSDir) Load() (*tls.Certificate, *x509.CertPool, error) {
	m, err := d.r.get()
	if err != nil {
		return nil, nil, err
	}
	return &m.cert, m.pool, nil
}

type material struct {
	cert tls.Certificate
	pool *x509.CertPool
}

// reloader re-reads the TLS directory when its files change (checked at most once a
// second).
type reloader struct {
	dir     string
	mu      sync.Mutex
	cur     *material
	stamp   string
	checked time.Time
}

func (r *reloader) get() (*material, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && time.Since(r.checked) < time.Second {
		return r.cur, nil
	}
	stamp := ""
	for _, f := range []string{CertFile, KeyFile, CAFile} {
		fi, err := os.Stat(filepath.Join(r.dir, f))
		if err != nil {
			if r.cur != nil {
				return r.cur, nil // mid-update: keep serving the last good one
			}
			return nil, fmt.Errorf("nodeagent: tls: %w", err)
		}
		stamp += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	r.checked = time.Now()
	if r.cur != nil && stamp == r.stamp {
		return r.cur, nil
	}
	m, err := loadMaterial(r.dir)
	if err != nil {
		if r.cur != nil {
			return r.cur, nil
		}
		return nil, err
	}
	r.cur, r.stamp = m, stamp
	return m, nil
}

func loadMaterial(dir string) (*material, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("nodeagent: tls: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("nodeagent: tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("nodeagent: tls: %s holds no certificate", filepath.Join(dir, CAFile))
	}
	return &material{cert: cert, pool: pool}, nil
}

// WriteTLSDir writes an agent's TLS directory: cert as CertFile and KeyFile, caPEM as
// CAFile (what the runner's Secret holds; tests and tools use it).
func WriteTLSDir(dir string, cert tls.Certificate, caPEM []byte) error {
	if err := pki.WriteKeyPair(dir, "tls", cert); err != nil {
		return err
	}
	for from, to := range map[string]string{"tls.pem": CertFile, "tls-key.pem": KeyFile} {
		if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
			return fmt.Errorf("nodeagent: tls: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, CAFile), caPEM, 0o644); err != nil { //nolint:gosec // a CA certificate is public
		return fmt.Errorf("nodeagent: tls: %w", err)
	}
	return nil
}
