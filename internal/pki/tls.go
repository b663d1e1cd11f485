package pki

import (
	"crypto/tls"
	"crypto/x509"
)

// NextProtos is the ALPN list of every config here: HTTP/2 (gRPC) first, then HTTP/1.1.
var NextProtos = []string{"h2", "http/1.1"}

// ServerTLSConfig serves cert with TLS 1.3 at least. Client certificates are
// verified against clientCAs: required if requireClientCert, else verified when
// presented (clientCAs nil and not required: not requested).
func ServerTLSConfig(cert tls.Certificate, clientCAs *x509.CertPool, requireClientCert bool) *tls.Config {
	c := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   append([]string(nil), NextProtos...),
		ClientCAs:    clientCAs,
	}
	switch {
	case requireClientCert:
		c.ClientAuth = tls.RequireAndVerifyClientCert
	case clientCAs != nil:
		c.ClientAuth = tls.VerifyClientCertIfGiven
	default:
		c.ClientAuth = tls.NoClientCert
	}
	return c
}

// ClientTLSConfig verifies the server against roots (nil: the system roots) and
// serverName, with TLS 1.3 at least, presenting cert if non-nil.
func ClientTLSConfig(cert *tls.Certificate, roots *x509.CertPool, serverName string) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		ServerName: serverName,
		NextProtos: append([]string(nil), NextProtos...),
	}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}
