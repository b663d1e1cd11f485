package dataplane

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// DefaultCertTTL is how long a data-plane client certificate is valid unless configured;
// MaxCertTTL the most it may be configured to. An issued certificate cannot be revoked:
// revoking the API key it was issued for stops new ones (ConnectSandbox re-checks the
// key before signing), and the ones issued before live out their TTL.
const (
	DefaultCertTTL = 15 * time.Minute
	MaxCertTTL     = time.Hour
)

// Issuer signs data-plane client certificates (the gateway's side of ConnectSandbox).
type Issuer struct {
	CA  *pki.CA
	TTL time.Duration // 0: DefaultCertTTL
}

// Issue signs a client certificate for csr's key granting perms on sandbox sandboxID of
// org (primary container container). The CSR's signature and key (ECDSA P-256 only) are
// checked; nothing else is taken from it. It implements gateway.DataPlaneIssuer.
func (is *Issuer) Issue(csr *x509.CertificateRequest, org, sandboxID, container string, perms []sandboxv1.SandboxDataPermission) (chainPEM []byte, notAfter time.Time, err error) {
	id := Identity{Org: org, SandboxID: sandboxID, Container: container, Perms: perms}
	if is == nil || is.CA == nil {
		return nil, time.Time{}, errors.New("dataplane: no CA")
	}
	if org == "" || sandboxID == "" || len(id.Perms) == 0 {
		return nil, time.Time{}, errors.New("dataplane: organization, sandbox and permissions are required")
	}
	ttl := is.TTL
	if ttl <= 0 {
		ttl = DefaultCertTTL
	}
	ttl = min(ttl, MaxCertTTL)
	cert, err := is.CA.SignCSR(csr, func(c *x509.Certificate) {
		c.URIs = append(c.URIs[:0], id.URI())
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}, ttl)
	if err != nil {
		return nil, time.Time{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), cert.NotAfter, nil
}

// ServerCAPEM is the bundle clients verify runners' data-plane listeners by.
func (is *Issuer) ServerCAPEM() []byte { return is.CA.CertPEM() }
