package runnerapi

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
)

// CertTTL is how long the certificates issued here live; they are renewed in use once
// half of that has passed.
const CertTTL = 24 * time.Hour

// GatewayURI is the URI SAN that identifies gateway name to runners.
func GatewayURI(name string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/gateway/" + name}
}

// GatewayName returns the name in cert's spiffe://sandboxd/gateway/<name> URI SAN, or "".
func GatewayName(cert *x509.Certificate) string {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != "sandboxd" {
			continue
		}
		if name, ok := strings.CutPrefix(u.Path, "/gateway/"); ok && name != "" && !strings.Contains(name, "/") {
			return name
		}
	}
	return ""
}

// ServerTLSConfig is a runner's mTLS configuration: TLS 1.3, a server certificate from ca
// for the DNS name runnerID (what gateways verify) and hosts (IP addresses or DNS names
// the runner is reached at) marked as a platform runner's (pki.PlatformRunnerURI: it
// holds the platform CA, so it serves every organization), and a required client
// certificate from ca that names a gateway. The certificate is reissued from ca as it ages.
func ServerTLSConfig(ca *pki.CA, runnerID string, hosts []string) (*tls.Config, error) {
	if runnerID == "" {
		return nil, errors.New("runnerapi: runner ID is required")
	}
	dns, ips := pki.SplitHosts([]string{runnerID}, hosts)
	get := pki.Renewing(func() (tls.Certificate, error) {
		return ca.IssueServerURIs("sandboxd runner "+runnerID, dns, ips, []*url.URL{pki.PlatformRunnerURI(runnerID)}, CertTTL)
	})
	cert, err := get()
	if err != nil {
		return nil, err
	}
	cfg := pki.ServerTLSConfig(*cert, ca.Pool(), true)
	cfg.Certificates = nil
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }
	cfg.VerifyConnection = verifyGateway
	return cfg, nil
}

// verifyGateway runs after the client's chain is verified against the CA: only gateways
// may call a runner.
func verifyGateway(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("runnerapi: a gateway client certificate is required")
	}
	leaf := cs.PeerCertificates[0]
	if GatewayName(leaf) == "" {
		return fmt.Errorf("runnerapi: client certificate %q is not a gateway's (no spiffe://sandboxd/gateway/<name> URI SAN)", leaf.Subject.CommonName)
	}
	return nil
}

// ClientTLSConfig is a gateway's mTLS configuration for calling runner runnerID: TLS 1.3,
// the runner's certificate verified against ca and the name runnerID, and a client
// certificate from ca naming the gateway gatewayName, reissued as it ages.
func ClientTLSConfig(ca *pki.CA, gatewayName, runnerID string) (*tls.Config, error) {
	if gatewayName == "" || strings.Contains(gatewayName, "/") {
		return nil, fmt.Errorf("runnerapi: invalid gateway name %q", gatewayName)
	}
	get := pki.Renewing(func() (tls.Certificate, error) {
		return ca.IssueClient("sandboxd gateway "+gatewayName, []*url.URL{GatewayURI(gatewayName)}, CertTTL)
	})
	cert, err := get()
	if err != nil {
		return nil, err
	}
	cfg := pki.ClientTLSConfig(cert, ca.Pool(), runnerID)
	cfg.Certificates = nil
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() }
	return cfg, nil
}

// ServerTLSConfigFromCert is ServerTLSConfig for a runner that holds a certificate issued
// to it (at registration) rather than the CA: cert (its DNS SAN is the runner ID gateways
// verify) is served as is, and a gateway client certificate verified against cas is
// required.
func ServerTLSConfigFromCert(cert tls.Certificate, cas *x509.CertPool) *tls.Config {
	cfg := pki.ServerTLSConfig(cert, cas, true)
	cfg.VerifyConnection = verifyGateway
	return cfg
}
