package egress

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress/cabundle"
)

// What a backend needs to give a sandbox egress secrets (docs/secrets.md, "Secrets
// that never enter the sandbox"), shared by the local and the Kubernetes backends: the
// sandbox's CA and placeholders (Build), where its containers find the CA (CAMount),
// the variables that point their TLS stacks at it (TrustEnv, ContainerEnv), and the
// public roots its bundle starts with (ReadRoots).

const (
	// CAMount is where a sandbox with egress secrets finds its CA, read-only: ca.pem
	// (the sandbox CA alone) and bundle.pem (the runner's public roots and the sandbox
	// CA).
	CAMount = "/etc/sandboxd-egress"
	// CATTL: a year, so that forks (which keep their source's CA and count their
	// lifetime from the fork) of forks can go on for months; the CA's key never leaves
	// the runner's memory and the CA is name-constrained to the sandbox's injection
	// hosts.
	CATTL = 366 * 24 * time.Hour
	// MaxRootsBytes bounds the roots bundle ReadRoots reads.
	MaxRootsBytes = 16 << 20
)

// DefaultRootsFiles are the host CA bundles tried, in order, for bundle.pem.
var DefaultRootsFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/cert.pem",                  // Alpine, macOS-like layouts
}

// TrustEnv is what points the common TLS stacks at the sandbox's bundle: OpenSSL
// (Python's ssl, Ruby, …) reads SSL_CERT_FILE, curl CURL_CA_BUNDLE, Python requests
// REQUESTS_CA_BUNDLE, Node.js adds NODE_EXTRA_CA_CERTS to its own roots.
var TrustEnv = map[string]string{
	"SSL_CERT_FILE":       CAMount + "/bundle.pem",
	"CURL_CA_BUNDLE":      CAMount + "/bundle.pem",
	"REQUESTS_CA_BUNDLE":  CAMount + "/bundle.pem",
	"NODE_EXTRA_CA_CERTS": CAMount + "/ca.pem",
}

// ContainerEnv is env (a container's secret environment; not changed) with the
// placeholders (variable: placeholder) and the TrustEnv variables that neither env nor
// the container's own environment (set) names.
func ContainerEnv(env map[string]string, set func(name string) bool, placeholders map[string]string) map[string]string {
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, placeholders)
	for k, v := range TrustEnv {
		if _, ok := out[k]; !ok && (set == nil || !set(k)) {
			out[k] = v
		}
	}
	return out
}

// ReadRoots is the public bundle bundle.pem starts with: file, or ("") the first of
// DefaultRootsFiles that exists (none: empty). At most MaxRootsBytes.
func ReadRoots(file string) ([]byte, error) {
	files := DefaultRootsFiles
	if file != "" {
		files = []string{file}
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) && file == "" {
			continue
		}
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		data, err := io.ReadAll(io.LimitReader(fh, MaxRootsBytes+1))
		if err != nil {
			return nil, err
		}
		if len(data) > MaxRootsBytes {
			return nil, fmt.Errorf("%s is larger than %d MiB", f, MaxRootsBytes>>20)
		}
		return data, nil
	}
	return nil, nil
}

// Rule is one egress secret of a sandbox's rules: the host it goes to, the header it
// fills, the secret's key (its value's key in the values map) and the variable its
// placeholder is shown in.
type Rule struct {
	Host, Header, Secret, EnvVar string
}

// Build makes a new sandbox's egress secrets: a placeholder per rule, the values from
// values (by Rule.Secret; a missing one is an error), and a CA of its own (CATTL). It
// returns them and the placeholders by variable.
func Build(sandboxID, org string, rules []Rule, values map[string]string) (*SandboxSecrets, map[string]string, error) {
	placeholders := map[string]string{}
	var injs []Injection
	for _, r := range rules {
		v, ok := values[r.Secret]
		if !ok {
			return nil, nil, fmt.Errorf("%w: egress secret %s has no value", ErrNoValue, r.Secret)
		}
		ph, err := NewPlaceholder()
		if err != nil {
			return nil, nil, err
		}
		placeholders[r.EnvVar] = ph
		injs = append(injs, Injection{Host: r.Host, Header: r.Header, Placeholder: ph, Value: v, Secret: r.Secret})
	}
	ss, err := NewSandboxSecrets(sandboxID, org, injs, CATTL)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: egress CA: %w", sandboxID, err)
	}
	return ss, placeholders, nil
}

// ErrNoValue: Build was given a rule without its value.
var ErrNoValue = errors.New("missing egress secret value")

// Bundle is bundle.pem: roots, then the sandbox CA's certificate (cabundle.Join, which
// the Kubernetes backend's sandbox-gate uses too).
func Bundle(roots, caPEM []byte) []byte { return cabundle.Join(roots, caPEM) }

// ReadUpstreamRoots reads the PEM roots the proxy verifies injection hosts against
// (Proxy.UpstreamRoots); "": nil, the system roots.
func ReadUpstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("egress upstream CA (--egress-upstream-ca): %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("egress upstream CA (--egress-upstream-ca) %s holds no PEM certificate: want a PEM file of CA certificates", file)
	}
	return pool, nil
}
