package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Moving a sandbox's egress secrets to another runner (docs/secrets.md, "Forks and
// moves"): a checkpoint restored elsewhere is the same memory, whose processes hold the
// placeholders and trust the sandbox's CA, so the runner that restores it must present
// certificates from that very CA. Export hands out the CA (certificate and key) and the
// injections without their values; Restore, on the receiving runner, checks all of it
// and rebuilds the secrets without values, which Fork then completes with the values the
// gateway resolved again from the store by reference (the secret's name). What Export
// returns travels over the runner wire only (mTLS), never through the blob store.

// Bounds of a restored state: it comes from another runner over the wire.
const (
	MaxStateInjections = 50       // runtime.MaxSecretEnvVars
	MaxStateCACert     = 64 << 10 // DER; 50 permitted names of 253 bytes fit many times
	MaxStateCAKey      = 1 << 10  // PKCS#8 DER of a P-256 key is ~140 bytes
	MaxStateSecretName = 512      // store/path#field
	maxStateHeader     = 64
)

var placeholderPattern = regexp.MustCompile(`^` + PlaceholderPrefix + `[0-9a-f]{32}$`)

// ErrInvalidState: a restored egress state is malformed, oversized or inconsistent.
var ErrInvalidState = errors.New("invalid egress secret state")

// Export returns what Restore needs on another runner: the CA's certificate and key
// (DER; PKCS#8 for the key) and the injections, their values left out. A sandbox whose
// secrets are lost (a restarted runner) has none to hand out.
func (s *SandboxSecrets) Export() (caCert, caKey []byte, injs []Injection, err error) {
	if s == nil || s.Lost || s.caKey == nil || s.ca == nil {
		return nil, nil, nil, errors.New("the runner no longer holds the sandbox's egress CA and placeholders (restarted): recreate the sandbox")
	}
	caKey, err = x509.MarshalPKCS8PrivateKey(s.caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, in := range s.Injections {
		in.Value = ""
		injs = append(injs, in)
	}
	return slices.Clone(s.ca.Raw), caKey, injs, nil
}

// Restore rebuilds the egress secrets of sandboxID (in org) from what Export returned on
// another runner, without values (Fork gives them): every field is bounded and checked,
// the certificate must be a self-signed P-256 CA, name-constrained (critical) to exactly
// the injections' hosts, valid at now, and the key must be its key. Errors wrap
// ErrInvalidState.
func Restore(sandboxID, org string, caCert, caKey []byte, injs []Injection, now time.Time) (*SandboxSecrets, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidState, fmt.Sprintf(format, args...))
	}
	switch {
	case len(caCert) == 0 || len(caCert) > MaxStateCACert:
		return nil, bad("CA certificate of %d bytes (1 to %d)", len(caCert), MaxStateCACert)
	case len(caKey) == 0 || len(caKey) > MaxStateCAKey:
		return nil, bad("CA key of %d bytes (1 to %d)", len(caKey), MaxStateCAKey)
	case len(injs) == 0 || len(injs) > MaxStateInjections:
		return nil, bad("%d injections (1 to %d)", len(injs), MaxStateInjections)
	}
	s := &SandboxSecrets{SandboxID: sandboxID, Org: org, leaves: map[string]*tls.Certificate{}}
	placeholders := map[string]bool{}
	hostHeader := map[string]bool{}
	for i, in := range injs {
		switch {
		case in.Value != "":
			return nil, bad("injection %d carries a value (values are resolved again, never carried)", i)
		case len(in.Host) > maxNameLen || in.Host != asciiLower(in.Host) || strings.HasPrefix(in.Host, "*.") || ValidPattern(in.Host) != nil:
			return nil, bad("injection %d: host %q is not a lower-case exact host name", i, clipStr(in.Host, 64))
		case len(in.Header) > maxStateHeader || !isToken(in.Header):
			return nil, bad("injection %d: header %q is not a header name of at most %d bytes", i, clipStr(in.Header, 64), maxStateHeader)
		case !placeholderPattern.MatchString(in.Placeholder):
			return nil, bad("injection %d: placeholder is not %s<32 hex digits>", i, PlaceholderPrefix)
		case placeholders[in.Placeholder]:
			return nil, bad("injection %d: placeholder repeated", i)
		case in.Secret == "" || len(in.Secret) > MaxStateSecretName || !printable(in.Secret):
			return nil, bad("injection %d: secret name of %d bytes (1 to %d printable)", i, len(in.Secret), MaxStateSecretName)
		case hostHeader[in.Host+"\x00"+asciiLower(in.Header)]:
			return nil, bad("injection %d: %s of %s is filled twice", i, in.Header, in.Host)
		}
		placeholders[in.Placeholder] = true
		hostHeader[in.Host+"\x00"+asciiLower(in.Header)] = true
		s.Injections = append(s.Injections, in)
		if !containsStr(s.Hosts, in.Host) {
			s.Hosts = append(s.Hosts, in.Host)
		}
	}
	cert, err := x509.ParseCertificate(caCert)
	if err != nil {
		return nil, bad("CA certificate: %v", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	switch {
	case !ok || pub.Curve != elliptic.P256():
		return nil, bad("CA certificate: not an ECDSA P-256 key")
	case !cert.BasicConstraintsValid || !cert.IsCA || !cert.MaxPathLenZero || cert.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, bad("CA certificate: not a CA for leaf certificates only")
	case cert.CheckSignatureFrom(cert) != nil || !bytes.Equal(cert.RawSubject, cert.RawIssuer):
		return nil, bad("CA certificate: not self-signed")
	case now.Before(cert.NotBefore) || !now.Before(cert.NotAfter):
		return nil, bad("CA certificate: not valid now (valid %s to %s)", cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	case !cert.PermittedDNSDomainsCritical || !sameStrings(cert.PermittedDNSDomains, s.Hosts) ||
		len(cert.ExcludedDNSDomains) > 0 || len(cert.PermittedIPRanges) > 0 || len(cert.PermittedEmailAddresses) > 0 || len(cert.PermittedURIDomains) > 0:
		return nil, bad("CA certificate: not name-constrained to exactly the injection hosts")
	}
	k, err := x509.ParsePKCS8PrivateKey(caKey)
	if err != nil {
		return nil, bad("CA key: %v", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(pub) {
		return nil, bad("CA key: not the certificate's key")
	}
	s.ca, s.caKey = cert, key
	s.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	return s, nil
}

// sameStrings reports whether a and b hold the same strings (as sets, each once).
func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !containsStr(b, x) {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
