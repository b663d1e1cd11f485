// Package pki is the platform certificate authority: an ECDSA P-256 CA kept in a
// directory, and the server, client (SPIFFE-style URI SANs such as
// spiffe://sandboxd/runner/<id>) and CSR-signed certificates it issues, plus TLS
// configurations for mTLS between the platform's processes.
//
// Files: <dir>/ca.pem and <dir>/ca-key.pem (0600) for the CA; WriteKeyPair writes
// <dir>/<name>.pem and <dir>/<name>-key.pem (0600). All writes are atomic.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

const (
	// CAValidity is how long a new CA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so a peer whose clock is slightly behind accepts a fresh certificate.
	clockSkew = 5 * time.Minute

	caCertFile = "ca.pem"
	caKeyFile  = "ca-key.pem"
)

// now is the clock (a test hook).
var now = time.Now

// CA is a loaded certificate authority. Safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// LoadOrCreateCA loads the CA in dir (ca.pem, ca-key.pem), creating it with common
// name name on first use (dir is created 0700 if missing). An existing CA is used
// as is, whatever its name. Concurrent callers (also in other processes) agree on
// one CA. A key without a certificate (an interrupted creation) is replaced; a
// certificate without its key is an error.
func LoadOrCreateCA(dir string, name string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	if _, err := os.Stat(certPath); err == nil {
		return loadCA(certPath, keyPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if name == "" {
		return nil, errors.New("pki: CA name is required")
	}
	ca, keyPEM, err := newCA(name)
	if err != nil {
		return nil, err
	}
	// Key first: a crash in between leaves a key without a certificate, which the next call replaces.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(certPath, ca.certPEM, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".ca.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pki: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("pki: lock: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func newCA(name string) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	ski, err := subjectKeyID(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             t.Add(-clockSkew),
		NotAfter:              t.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            1,
		SubjectKeyId:          ski,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return &CA{cert: cert, key: key, certPEM: encodeCert(der)}, keyPEM, nil
}

func loadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pki: %s exists but its key %s does not", certPath, keyPath)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return parseCA(certPEM, keyPEM, certPath, keyPath)
}

// NewCA makes a new CA with common name name (valid CAValidity) in memory and returns
// it with its private key in PEM (PKCS#8): what a caller that keeps the CA elsewhere than
// in a directory (a Kubernetes Secret) stores; ParseCA reads it back.
func NewCA(name string) (*CA, []byte, error) {
	if name == "" {
		return nil, nil, errors.New("pki: CA name is required")
	}
	return newCA(name)
}

// ParseCA is the CA of certPEM (its first certificate, which must be a CA) and keyPEM
// (an ECDSA P-256 key matching it): what NewCA returned, read back.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	return parseCA(certPEM, keyPEM, "the CA certificate", "the CA key")
}

func parseCA(certPEM, keyPEM []byte, certName, keyName string) (*CA, error) {
	certs, err := parseCerts(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", certName, err)
	}
	cert := certs[0]
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certName)
	}
	signer, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", keyName, err)
	}
	key, ok := signer.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("pki: %s: the CA key must be ECDSA P-256", keyName)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s does not match %s", keyName, certName)
	}
	return &CA{cert: cert, key: key, certPEM: encodeCert(cert.Raw)}, nil
}

// Certificate returns the CA certificate (do not modify).
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM returns the CA certificate in PEM, as in ca.pem.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Pool returns a new pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// IssueServer issues a TLS server certificate (ExtKeyUsage serverAuth) for the
// given DNS names and IPs, with a new P-256 key, valid for ttl (capped at the CA's expiry).
func (ca *CA) IssueServer(commonName string, dnsNames []string, ips []net.IP, ttl time.Duration) (tls.Certificate, error) {
	return ca.IssueServerURIs(commonName, dnsNames, ips, nil, ttl)
}

// IssueServerURIs is IssueServer with URI SANs as well (e.g. a runner's
// PlatformRunnerURI).
func (ca *CA) IssueServerURIs(commonName string, dnsNames []string, ips []net.IP, uris []*url.URL, ttl time.Duration) (tls.Certificate, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return tls.Certificate{}, errors.New("pki: a server certificate needs at least one DNS name or IP address")
	}
	for _, u := range uris {
		if u == nil || u.Scheme == "" {
			return tls.Certificate{}, fmt.Errorf("pki: server certificate URI %v: want an absolute URI", u)
		}
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		URIs:        uris,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ttl)
}

// IssueClient issues a TLS client certificate (ExtKeyUsage clientAuth) whose
// identity is its URI SANs (e.g. spiffe://sandboxd/runner/<id>), with a new P-256 key.
func (ca *CA) IssueClient(commonName string, uris []*url.URL, ttl time.Duration) (tls.Certificate, error) {
	for _, u := range uris {
		if u == nil || u.Scheme == "" {
			return tls.Certificate{}, fmt.Errorf("pki: client certificate URI %v: want an absolute URI", u)
		}
	}
	if commonName == "" && len(uris) == 0 {
		return tls.Certificate{}, errors.New("pki: a client certificate needs a common name or a URI")
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		URIs:        uris,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ttl)
}

func (ca *CA) issue(tmpl *x509.Certificate, ttl time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: %w", err)
	}
	cert, err := ca.sign(tmpl, &key.PublicKey, ttl, nil)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}, nil
}

// SignCSR issues a certificate for the key in csr after checking the CSR's
// signature; only ECDSA P-256 keys are accepted. Nothing else is taken from the
// CSR: tmpl sets the identity (Subject, DNSNames, IPAddresses, URIs) and may change
// ExtKeyUsage (default clientAuth) or shorten NotAfter. The result is never a CA.
func (ca *CA) SignCSR(csr *x509.CertificateRequest, tmpl func(*x509.Certificate), ttl time.Duration) (*x509.Certificate, error) {
	if csr == nil {
		return nil, errors.New("pki: SignCSR: no CSR")
	}
	if tmpl == nil {
		return nil, errors.New("pki: SignCSR: tmpl must set the certificate's identity")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: CSR signature invalid: %w", err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("pki: CSR key is %s; only ECDSA P-256 keys are accepted", keyKind(csr.PublicKey))
	}
	c := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	return ca.sign(c, pub, ttl, tmpl)
}

func keyKind(k crypto.PublicKey) string {
	switch k := k.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case nil:
		return "missing"
	default:
		return fmt.Sprintf("%T", k)
	}
}

// sign fills in serial, validity, key usage and SKI, lets edit adjust the
// template, then enforces leaf constraints and signs.
func (ca *CA) sign(tmpl *x509.Certificate, pub *ecdsa.PublicKey, ttl time.Duration, edit func(*x509.Certificate)) (*x509.Certificate, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("pki: certificate lifetime %v must be positive", ttl)
	}
	t := now()
	if !t.Before(ca.cert.NotAfter) {
		return nil, fmt.Errorf("pki: CA %q expired at %s", ca.cert.Subject.CommonName, ca.cert.NotAfter.Format(time.RFC3339))
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	ski, err := subjectKeyID(pub)
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = t.Add(-clockSkew)
	tmpl.NotAfter = t.Add(ttl)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.SubjectKeyId = ski
	if edit != nil {
		edit(tmpl)
	}
	tmpl.IsCA = false
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLen, tmpl.MaxPathLenZero = 0, false
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign: %w", err)
	}
	return x509.ParseCertificate(der)
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil // positive, non-zero
}

// subjectKeyID is RFC 7093 method 1: the leftmost 160 bits of the SHA-256 of the public key bits.
func subjectKeyID(pub *ecdsa.PublicKey) ([]byte, error) {
	b, err := pub.Bytes()
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	h := sha256.Sum256(b)
	return h[:20], nil
}
