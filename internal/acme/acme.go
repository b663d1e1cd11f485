// Package acme gets a runner edge's wildcard certificate *.<runner-id>.<base-domain> from
// an ACME CA (RFC 8555: Let's Encrypt, ZeroSSL, a company's own step-ca, …) and keeps it
// renewed, for platforms whose endpoints live under a public domain.
//
// A wildcard can only be proven with the DNS-01 challenge, so the runner writes the
// challenge's TXT record into the domain's DNS with RFC 2136 dynamic updates (see
// RFC2136). One wildcard per runner, rather than a certificate per endpoint, also keeps
// sandbox names out of the public Certificate Transparency logs and lets a new sandbox's
// endpoint work at once. certmagic does the ACME protocol, storage, locking and renewal.
package acme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// Config says where to get the certificate and how to prove the domain.
type Config struct {
	Directory string // the CA's ACME directory URL
	Email     string // account contact (optional; CAs use it for expiry notices)
	// RootCAs verify the directory's HTTPS (nil: the system's roots). Tests and private
	// CAs set it.
	RootCAs *x509.CertPool
	// DNS receives the DNS-01 challenge records.
	DNS *RFC2136
	// Resolvers find the zone of the name (its SOA), host:port; nil: DNS.Server.
	Resolvers []string
	// PropagationTimeout: how long to wait for the record to show at the zone's
	// authoritative servers before the CA is asked to look; 0 skips the check (an
	// RFC 2136 primary answers with the record as soon as the update is acknowledged).
	PropagationTimeout time.Duration
	// StorageDir keeps the account, certificate and key between runs (required).
	StorageDir string
	Logger     *slog.Logger
}

// Manager keeps one wildcard certificate issued and renewed.
type Manager struct {
	cfg   *certmagic.Config
	cache *certmagic.Cache
	name  string
}

// Wildcard obtains (or loads from storage) the certificate for *.<domain> and keeps it
// renewed until Stop. It returns once a certificate is in hand.
func Wildcard(ctx context.Context, c Config, domain string) (*Manager, error) {
	switch {
	case c.Directory == "":
		return nil, errors.New("acme: no directory URL")
	case c.DNS == nil || c.DNS.Server == "":
		return nil, errors.New("acme: no DNS server for the DNS-01 challenge")
	case c.StorageDir == "":
		return nil, errors.New("acme: no storage directory")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	resolvers := c.Resolvers
	if len(resolvers) == 0 {
		resolvers = []string{c.DNS.Server}
	}
	propagation := c.PropagationTimeout
	if propagation == 0 {
		propagation = -1 // certmagic: no check
	}
	zl := zap.New(slogCore{log: c.Logger.With("component", "acme")})
	var cm *certmagic.Config
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return cm, nil },
		Logger:           zl,
	})
	cm = certmagic.New(cache, certmagic.Config{
		Storage: &certmagic.FileStorage{Path: c.StorageDir},
		Logger:  zl,
		// Stapling needs the CA's OCSP responder; CAs are dropping OCSP, and a failed
		// fetch is only noise.
		OCSP: certmagic.OCSPConfig{DisableStapling: true},
	})
	cm.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(cm, certmagic.ACMEIssuer{
		CA: c.Directory, TestCA: c.Directory, Email: c.Email, Agreed: true,
		TrustedRoots:            c.RootCAs,
		DisableHTTPChallenge:    true,
		DisableTLSALPNChallenge: true,
		DNS01Solver: &certmagic.DNS01Solver{DNSManager: certmagic.DNSManager{
			DNSProvider: c.DNS, Resolvers: resolvers, PropagationTimeout: propagation, Logger: zl,
		}},
		Logger: zl,
	})}
	name := "*." + trimDot(domain)
	if err := cm.ManageSync(ctx, []string{name}); err != nil {
		cache.Stop()
		return nil, fmt.Errorf("acme: certificate for %s from %s: %w", name, c.Directory, err)
	}
	return &Manager{cfg: cm, cache: cache, name: name}, nil
}

// GetCertificate serves the wildcard for names under the domain (tls.Config's hook).
func (m *Manager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return m.cfg.GetCertificate(hello)
}

// Leaf is the certificate currently served.
func (m *Manager) Leaf() (*x509.Certificate, error) {
	c, err := m.cfg.CacheManagedCertificate(context.Background(), m.name)
	if err != nil {
		return nil, fmt.Errorf("acme: %w", err)
	}
	return c.Leaf, nil
}

// Stop ends renewal.
func (m *Manager) Stop() { m.cache.Stop() }
