package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/internal/acme"
)

// acmeFlags configure an edge certificate from an ACME CA instead of the platform CA.
type acmeFlags struct {
	directory, email, roots       string
	dnsServer                     string
	tsigKey, tsigAlg, tsigSecretF string
}

func (a *acmeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.directory, "acme-directory", "", "ACME directory URL (e.g. https://acme-v02.api.letsencrypt.org/directory): the edge's wildcard certificate comes from there, proven by DNS-01 records written with RFC 2136 updates to --acme-dns-server")
	fs.StringVar(&a.email, "acme-email", "", "ACME account contact")
	fs.StringVar(&a.roots, "acme-ca-roots", "", "PEM file of roots to trust the ACME directory by (default: the system's)")
	fs.StringVar(&a.dnsServer, "acme-dns-server", "", "HOST:PORT of the primary name server of the base domain's zone, which takes RFC 2136 updates")
	fs.StringVar(&a.tsigKey, "acme-tsig-key", "", "TSIG key name that signs the updates (empty: unsigned)")
	fs.StringVar(&a.tsigAlg, "acme-tsig-algorithm", "hmac-sha256", "TSIG algorithm")
	fs.StringVar(&a.tsigSecretF, "acme-tsig-secret-file", "", "file holding the TSIG key's base64 secret")
}

func (a acmeFlags) enabled() bool { return a.directory != "" }

// validate checks that an ACME certificate (if any) has what it needs.
func (a acmeFlags) validate() error {
	switch {
	case !a.enabled():
		return nil
	case a.dnsServer == "":
		return errors.New("--acme-directory needs --acme-dns-server")
	case a.tsigKey != "" && a.tsigSecretF == "":
		return errors.New("--acme-tsig-key needs --acme-tsig-secret-file")
	}
	return nil
}

// certificate obtains the wildcard for *.<runnerID>.<baseDomain> and keeps it renewed
// until stop. The flags are validated.
func (a *acmeFlags) certificate(ctx context.Context, dataDir, runnerID, baseDomain string, log *slog.Logger) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), func(), error) {
	dns := &acme.RFC2136{Server: a.dnsServer}
	if a.tsigKey != "" {
		b, err := os.ReadFile(a.tsigSecretF)
		if err != nil {
			return nil, nil, fmt.Errorf("--acme-tsig-secret-file: %w", err)
		}
		dns.KeyName, dns.KeyAlgorithm, dns.KeySecret = a.tsigKey, a.tsigAlg, strings.TrimSpace(string(b))
	}
	cfg := acme.Config{Directory: a.directory, Email: a.email, DNS: dns,
		StorageDir: filepath.Join(dataDir, "acme"), Logger: log}
	if a.roots != "" {
		b, err := os.ReadFile(a.roots)
		if err != nil {
			return nil, nil, fmt.Errorf("--acme-ca-roots: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, nil, fmt.Errorf("--acme-ca-roots %s: no PEM certificates", a.roots)
		}
	}
	m, err := acme.Wildcard(ctx, cfg, runnerID+"."+baseDomain)
	if err != nil {
		return nil, nil, err
	}
	return m.GetCertificate, m.Stop, nil
}
