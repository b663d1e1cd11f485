package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Egress secret injection (docs/secrets.md, "Secrets that never enter the sandbox"): for
// a host a sandbox's rules attach a secret to, the Proxy terminates the sandbox's TLS
// with a certificate from the sandbox's own CA (which the sandbox trusts, and whose key
// never leaves the runner's memory), opens its own TLS connection to the real host
// (verifying its certificate), and in each HTTP/1.1 request replaces the sandbox's
// placeholder with the secret's value in the named header. Connections to every other
// host are spliced as before, never decrypted.

// responseWait bounds how long a refused request's answer waits for the responses to
// the requests forwarded before it on the same connection.
const responseWait = 30 * time.Second

// PlaceholderPrefix starts every placeholder.
const PlaceholderPrefix = "sbx-secret-"

// NewPlaceholder returns a fresh random placeholder (sbx-secret-<32 hex digits>).
func NewPlaceholder() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return PlaceholderPrefix + hex.EncodeToString(b[:]), nil
}

// Injection is one secret a sandbox's requests to Host get in Header.
type Injection struct {
	Host        string // exact host name, lower-case
	Header      string // e.g. "Authorization"
	Placeholder string // what the sandbox has instead of the value
	Value       string // the secret's value (memory only)
	Secret      string // the secret's name for the audit log: store/path[#field]
}

// SandboxSecrets is what the proxy needs to inject into one sandbox's requests. Build
// it with NewSandboxSecrets; Lost marks a sandbox whose values and CA key are gone (a
// restarted runner): its connections to the hosts are refused, never spliced with the
// placeholder nor injected.
type SandboxSecrets struct {
	SandboxID, Org string
	Injections     []Injection
	Lost           bool // the runner no longer has the values (after a restart)
	Hosts          []string

	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewSandboxSecrets makes a sandbox's CA (ECDSA P-256, valid for ttl, name-constrained
// to the injections' hosts, its key in memory only) and returns it with the injections.
func NewSandboxSecrets(sandboxID, org string, injs []Injection, ttl time.Duration) (*SandboxSecrets, error) {
	s := &SandboxSecrets{SandboxID: sandboxID, Org: org, Injections: injs, leaves: map[string]*tls.Certificate{}}
	for _, in := range injs {
		if !containsStr(s.Hosts, in.Host) {
			s.Hosts = append(s.Hosts, in.Host)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sandboxd egress CA " + sandboxID, Organization: []string{"sandboxd"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		// Even a leaked CA key could sign only for the hosts that get secrets.
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         s.Hosts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	if s.ca, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	s.caKey = key
	s.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return s, nil
}

// Fork returns the secrets of sandboxID, a fork of s's sandbox (a copy of its memory, on
// the same runner): the same CA (its restored processes may hold the certificate
// already) and the same placeholders (they are in its memory), with values, freshly
// resolved, by secret name (Injection.Secret). Every injection needs its value; a source
// whose values are lost (a restarted runner) cannot be forked with them. until is the end
// of the fork's lifetime: the CA, its source's, must outlive it (ErrCAExpiresFirst: its
// expiry counts from the source's create, and a CA with a later one would be another
// certificate, which the restored processes do not trust).
func (s *SandboxSecrets) Fork(sandboxID, org string, values map[string]string, until time.Time) (*SandboxSecrets, error) {
	if s.Lost || s.caKey == nil {
		return nil, errors.New("the runner no longer holds the source's egress secrets (restarted): recreate the sandbox")
	}
	if s.ca.NotAfter.Before(until) {
		return nil, &CAExpiresFirstError{NotAfter: s.ca.NotAfter, Until: until}
	}
	f := &SandboxSecrets{SandboxID: sandboxID, Org: org, Hosts: append([]string(nil), s.Hosts...),
		ca: s.ca, caKey: s.caKey, caPEM: s.caPEM, leaves: map[string]*tls.Certificate{}}
	for _, in := range s.Injections {
		v, ok := values[in.Secret]
		if !ok {
			return nil, fmt.Errorf("egress secret %s has no value", in.Secret)
		}
		in.Value = v
		f.Injections = append(f.Injections, in)
	}
	return f, nil
}

// ErrCAExpiresFirst: a fork of a sandbox with egress secrets would outlive its source's
// egress CA (CAExpiresFirstError says when each ends).
var ErrCAExpiresFirst = errors.New("the source's egress CA expires before the fork's lifetime ends")

// CAExpiresFirstError is ErrCAExpiresFirst with the CA's expiry and the fork's lifetime end.
type CAExpiresFirstError struct {
	NotAfter, Until time.Time
}

func (e *CAExpiresFirstError) Error() string {
	return fmt.Sprintf("the source's egress CA, which a fork keeps (its restored processes trust it), expires at %s, before the fork's lifetime ends at %s: "+
		"its intercepted HTTPS would fail from then on: recreate the sandbox instead (a new sandbox gets a CA of its own)",
		e.NotAfter.UTC().Format(time.RFC3339), e.Until.UTC().Format(time.RFC3339))
}

func (e *CAExpiresFirstError) Unwrap() error { return ErrCAExpiresFirst }

// LostSecrets is the record of a sandbox whose injections a restarted runner cannot
// serve any more (hosts only).
func LostSecrets(sandboxID, org string, hosts []string) *SandboxSecrets {
	return &SandboxSecrets{SandboxID: sandboxID, Org: org, Hosts: hosts, Lost: true}
}

// CACertPEM is the sandbox CA's certificate (PEM), for the sandbox's trust store.
func (s *SandboxSecrets) CACertPEM() []byte { return append([]byte(nil), s.caPEM...) }

// CACert is the sandbox CA's certificate.
func (s *SandboxSecrets) CACert() *x509.Certificate { return s.ca }

func containsStr(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// intercepts reports whether connections to host (lower-case) are intercepted.
func (s *SandboxSecrets) intercepts(host string) bool {
	return s != nil && containsStr(s.Hosts, host)
}

// forHost returns the injections for host.
func (s *SandboxSecrets) forHost(host string) []Injection {
	var out []Injection
	for _, in := range s.Injections {
		if in.Host == host {
			out = append(out, in)
		}
	}
	return out
}

// leaf returns a certificate for host signed by the sandbox's CA (made once, kept).
func (s *SandboxSecrets) leaf(host string) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.leaves[host]; c != nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     s.ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, &key.PublicKey, s.caKey)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	s.leaves[host] = c
	return c, nil
}

// prefixConn replays what was read of a connection (the ClientHello) before the rest.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// intercept serves a connection whose ClientHello (hello, already read) names host, one
// of ss's hosts.
func (p *Proxy) intercept(ctx context.Context, c net.Conn, hello []byte, host string, src netip.Addr, ss *SandboxSecrets) {
	audit := func(secret, header, result string) {
		p.Audit.Record(AuditEntry{Sandbox: ss.SandboxID, Org: ss.Org, Source: src.String(), Host: host, Secret: secret, Header: header, Result: result})
	}
	injs := ss.forHost(host)
	if ss.Lost || len(injs) == 0 {
		audit("", "", "refused: the runner no longer holds this sandbox's secrets (restarted); recreate the sandbox")
		p.log().Info("egress proxy: refused: secrets lost with a runner restart", "src", src, "sni", host, "sandbox", ss.SandboxID)
		p.deny(c)
		return
	}
	timeout := p.HandshakeTimeout
	if timeout <= 0 {
		timeout = defaultHandshakeTimeout
	}
	// The upstream first: a host that does not answer or presents a bad certificate is
	// refused before the sandbox's handshake completes.
	up, err := p.connect(ctx, host)
	if err != nil {
		audit("", "", "refused: "+err.Error())
		p.log().Info("egress proxy: refused: "+err.Error(), "src", src, "sni", host)
		p.deny(c)
		return
	}
	if !p.add(up) {
		_ = up.Close()
		return
	}
	defer p.remove(up)
	upTLS := tls.Client(up, &tls.Config{
		ServerName: host,
		RootCAs:    p.UpstreamRoots,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	_ = up.SetDeadline(time.Now().Add(timeout))
	if err := upTLS.HandshakeContext(ctx); err != nil {
		audit("", "", "refused: upstream TLS: "+err.Error())
		p.log().Info("egress proxy: refused: upstream TLS", "src", src, "sni", host, "err", err)
		p.deny(c)
		return
	}
	_ = up.SetDeadline(time.Time{})
	if np := upTLS.ConnectionState().NegotiatedProtocol; np != "" && np != "http/1.1" {
		audit("", "", "refused: upstream chose "+np)
		p.deny(c)
		return
	}
	leaf, err := ss.leaf(host)
	if err != nil {
		p.log().Error("egress proxy: sandbox CA", "sandbox", ss.SandboxID, "err", err)
		p.deny(c)
		return
	}
	cTLS := tls.Server(&prefixConn{Conn: c, r: io.MultiReader(strings.NewReader(string(hello)), c)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"}, // HTTP/2 is refused: the client falls back
		MinVersion:   tls.VersionTLS12,
	})
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := cTLS.HandshakeContext(ctx); err != nil {
		p.log().Info("egress proxy: sandbox TLS handshake", "src", src, "sni", host, "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	p.log().Debug("egress proxy: intercepting", "src", src, "sni", host, "sandbox", ss.SandboxID)

	// Responses flow back as they come; requests are parsed one by one.
	respDone := make(chan struct{})
	var refusing atomic.Bool
	go func() {
		defer close(respDone)
		_, _ = io.Copy(cTLS, upTLS)
		if !refusing.Load() {
			_ = cTLS.CloseWrite()
			_ = c.Close() // ends the request loop's read, too
		}
	}()
	// refuseRequest answers he after the responses to the requests already forwarded
	// (the upstream is told there are no more and given responseWait to finish them).
	refuseRequest := func(he *headError) {
		refusing.Store(true)
		_ = upTLS.CloseWrite()
		select {
		case <-respDone:
		case <-time.After(responseWait):
		case <-ctx.Done():
		}
		p.answer(cTLS, he)
		_ = c.Close()
	}
	hinjs := make([]headInjection, len(injs))
	for i, in := range injs {
		hinjs[i] = headInjection{Header: in.Header, Placeholder: in.Placeholder, Value: in.Value}
	}
	br := bufio.NewReaderSize(cTLS, 4096)
	for {
		head, err := readHead(br, MaxHeadBytes)
		if errors.Is(err, io.EOF) {
			_ = upTLS.CloseWrite()
			break
		}
		var r *headRewrite
		if err == nil {
			r, err = rewriteHead(head, host, hinjs)
		}
		if err != nil {
			var he *headError
			if errors.As(err, &he) {
				audit(secretNames(injs), "", "refused: "+he.msg)
				p.log().Info("egress proxy: request refused: "+he.msg, "src", src, "sni", host, "sandbox", ss.SandboxID)
				refuseRequest(he)
			}
			_ = up.Close()
			break
		}
		for _, i := range r.used {
			audit(injs[i].Secret, injs[i].Header, "injected")
		}
		if _, err := upTLS.Write(r.out); err != nil {
			break
		}
		if err := copyBody(upTLS, br, r); err != nil {
			var he *headError
			if errors.As(err, &he) {
				audit(secretNames(injs), "", "refused: request body: "+he.msg)
			}
			_ = up.Close()
			break
		}
		if r.upgrade {
			// A protocol switch (WebSocket): no more HTTP heads to look at.
			_, _ = io.Copy(upTLS, br)
			_ = upTLS.CloseWrite()
			break
		}
	}
	// The sandbox has closed its side (or a request was refused): the responses still
	// coming get responseWait, so an upstream that keeps its side open does not pin the
	// connection (two descriptors and a goroutine, counted per source) for ever.
	select {
	case <-respDone:
	case <-time.After(responseWait):
	case <-ctx.Done():
	}
	_ = up.Close()
	_ = c.Close()
}

// answer sends the sandbox an HTTP error for a refused request, then closes.
func (p *Proxy) answer(c *tls.Conn, he *headError) {
	body := "sandboxd egress proxy: " + he.msg + "\n"
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		he.status, http.StatusText(he.status), len(body), body)
	_ = c.CloseWrite()
}

func secretNames(injs []Injection) string {
	names := make([]string, 0, len(injs))
	for _, in := range injs {
		if !containsStr(names, in.Secret) {
			names = append(names, in.Secret)
		}
	}
	return strings.Join(names, ",")
}
