package egress

import (
	"bufio"
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	tPlace = "sbx-secret-0123456789abcdef0123456789abcdef"
	tValue = "real-token-XYZ"
)

var tInjs = []headInjection{{Header: "Authorization", Placeholder: tPlace, Value: tValue}}

func TestRewriteHeadInjects(t *testing.T) {
	head := "POST /v1/x?q=" + tPlace + " HTTP/1.1\r\nHost: api.example.test\r\nauthorization: Bearer " + tPlace +
		"\r\nX-Other: " + tPlace + "\r\nContent-Length: 5\r\n\r\n"
	r, err := rewriteHead([]byte(head), "api.example.test", tInjs)
	if err != nil {
		t.Fatal(err)
	}
	out := string(r.out)
	if !strings.Contains(out, "authorization: Bearer "+tValue+"\r\n") {
		t.Errorf("header not filled:\n%s", out)
	}
	// Only the named header: the target and other fields keep the placeholder.
	if !strings.Contains(out, "X-Other: "+tPlace) || !strings.Contains(out, "q="+tPlace) {
		t.Errorf("placeholder replaced outside the header:\n%s", out)
	}
	if r.kind != bodyLength || r.length != 5 || len(r.used) != 1 || r.method != "POST" {
		t.Errorf("rewrite = %+v", r)
	}
	// No placeholder: nothing used, head unchanged.
	plain := "GET / HTTP/1.1\r\nHost: API.example.test:443\r\nAuthorization: Bearer other\r\n\r\n"
	r, err = rewriteHead([]byte(plain), "api.example.test", tInjs)
	if err != nil || string(r.out) != plain || len(r.used) != 0 {
		t.Errorf("plain request: %v %q %v", err, r.out, r)
	}
	// A named header.
	xk := []headInjection{{Header: "X-Api-Key", Placeholder: tPlace, Value: tValue}}
	r, err = rewriteHead([]byte("GET / HTTP/1.1\r\nHost: api.example.test\r\nX-API-KEY: "+tPlace+"\r\nAuthorization: "+tPlace+"\r\n\r\n"), "api.example.test", xk)
	if err != nil || !strings.Contains(string(r.out), "X-API-KEY: "+tValue) || !strings.Contains(string(r.out), "Authorization: "+tPlace) {
		t.Errorf("named header: %v %q", err, r.out)
	}
}

func TestRewriteHeadRefuses(t *testing.T) {
	host := "api.example.test"
	for _, tc := range []struct{ name, head, want string }{
		{"other host", "GET / HTTP/1.1\r\nHost: other.example.test\r\nAuthorization: " + tPlace + "\r\n\r\n", "not the TLS server name"},
		{"host other port", "GET / HTTP/1.1\r\nHost: api.example.test:8443\r\n\r\n", "not the TLS server name"},
		{"two hosts", "GET / HTTP/1.1\r\nHost: api.example.test\r\nHost: other.example.test\r\n\r\n", "2 Host fields"},
		{"no host", "GET / HTTP/1.1\r\nAuthorization: x\r\n\r\n", "0 Host fields"},
		{"absolute form", "GET https://other.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n", "origin form"},
		{"connect", "CONNECT other:443 HTTP/1.1\r\nHost: api.example.test\r\n\r\n", "CONNECT"},
		{"http2", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "only HTTP/1.1"},
		{"fold", "GET / HTTP/1.1\r\nHost: api.example.test\r\nX: a\r\n b\r\n\r\n", "folding"},
		{"bare lf", "GET / HTTP/1.1\r\nHost: api.example.test\nX: a\r\n\r\n", "control byte"},
		{"nul", "GET / HTTP/1.1\r\nHost: api.example.test\r\nX: a\x00\r\n\r\n", "control byte"},
		{"space before colon", "GET / HTTP/1.1\r\nHost : api.example.test\r\n\r\n", "malformed header"},
		{"te and cl", "POST / HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "both"},
		{"te gzip", "POST / HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "only chunked"},
		{"two te", "POST / HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "more than one"},
		{"cl differ", "POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "differing"},
		{"cl sign", "POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: +3\r\n\r\n", "malformed Content-Length"},
		{"bad request line", "GET /\r\nHost: api.example.test\r\n\r\n", "malformed request line"},
	} {
		_, err := rewriteHead([]byte(tc.head), host, tInjs)
		var he *headError
		if !errors.As(err, &he) || !strings.Contains(he.msg, tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	// A value that would break the head is refused, never written.
	bad := []headInjection{{Header: "Authorization", Placeholder: tPlace, Value: "a\r\nHost: evil"}}
	if _, err := rewriteHead([]byte("GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: "+tPlace+"\r\n\r\n"), host, bad); err == nil || strings.Contains(err.Error(), "evil") {
		t.Errorf("CRLF in value: %v", err)
	}
	// Too many header fields.
	many := "GET / HTTP/1.1\r\nHost: api.example.test\r\n" + strings.Repeat("X: y\r\n", maxHeaderLines+1) + "\r\n"
	if _, err := rewriteHead([]byte(many), host, tInjs); err == nil {
		t.Error("too many fields accepted")
	}
}

func TestReadHeadBounded(t *testing.T) {
	big := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHeadBytes) + "\r\n\r\n"
	_, err := readHead(bufio.NewReader(strings.NewReader(big)), MaxHeadBytes)
	var he *headError
	if !errors.As(err, &he) || he.status != 431 {
		t.Fatalf("oversized head: %v", err)
	}
	two := "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"
	br := bufio.NewReader(strings.NewReader(two))
	h1, err1 := readHead(br, MaxHeadBytes)
	h2, err2 := readHead(br, MaxHeadBytes)
	_, err3 := readHead(br, MaxHeadBytes)
	if err1 != nil || err2 != nil || !strings.HasPrefix(string(h2), "GET /2") || len(h1)+len(h2) != len(two) || !errors.Is(err3, io.EOF) {
		t.Fatalf("pipelined: %q %v %q %v %v", h1, err1, h2, err2, err3)
	}
	if _, err := readHead(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost")), MaxHeadBytes); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("cut head: %v", err)
	}
}

func TestCopyChunked(t *testing.T) {
	body := "5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\nNEXT"
	br := bufio.NewReader(strings.NewReader(body))
	var out bytes.Buffer
	if err := copyChunked(&out, br); err != nil {
		t.Fatal(err)
	}
	if out.String() != strings.TrimSuffix(body, "NEXT") {
		t.Errorf("copied %q", out.String())
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "NEXT" {
		t.Errorf("rest %q", rest)
	}
	for _, bad := range []string{"zz\r\n", "5\r\nhelloXX", "-1\r\n", "+5\r\nhello\r\n0\r\n\r\n", "+0\r\n\r\n", "0x5\r\nhello\r\n0\r\n\r\n", "5\nhello\r\n0\r\n\r\n", "0\r\n" + strings.Repeat("T: x\r\n", 5000)} {
		if err := copyChunked(io.Discard, bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q: accepted", bad[:min(len(bad), 20)])
		}
	}
}

// FuzzRewriteHead: whatever the head, the rewriter never panics, never lets the value
// out anywhere but the named header, and what it sends is itself a head it accepts.
func FuzzRewriteHead(f *testing.F) {
	f.Add("GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer " + tPlace + "\r\n\r\n")
	f.Add("POST /x HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: chunked\r\n\r\n")
	f.Add("GET / HTTP/1.0\r\nHost: api.example.test:443\r\nContent-Length: 0\r\nContent-Length: 00\r\n\r\n")
	f.Add("GET / HTTP/1.1\r\nHost: other\r\n\r\n")
	f.Fuzz(func(t *testing.T, head string) {
		br := bufio.NewReader(strings.NewReader(head))
		h, err := readHead(br, 4096)
		if err != nil {
			return
		}
		r, err := rewriteHead(h, "api.example.test", tInjs)
		if err != nil {
			return
		}
		r2, err := rewriteHead(r.out, "api.example.test", nil)
		if err != nil {
			t.Fatalf("rewritten head refused: %v\n%q", err, r.out)
		}
		if r2.kind != r.kind || r2.length != r.length {
			t.Fatalf("framing changed: %+v vs %+v", r, r2)
		}
		// The value appears only in Authorization lines.
		for _, line := range strings.Split(string(r.out), "\r\n") {
			if strings.Contains(line, tValue) && !strings.HasPrefix(strings.ToLower(line), "authorization:") && !strings.Contains(head, tValue) {
				t.Fatalf("value outside its header: %q", line)
			}
		}
	})
}

func TestAuditLogBoundedNoValues(t *testing.T) {
	p := filepath.Join(t.TempDir(), "egress-audit.jsonl")
	a := &AuditLog{Path: p, MaxBytes: 1000}
	for range 50 {
		a.Record(AuditEntry{Sandbox: "sbx-1", Org: "org", Host: "api.example.test", Secret: "prod/api#token", Header: "Authorization", Result: "injected"})
	}
	_ = a.Close()
	st, err := os.Stat(p)
	if err != nil || st.Size() > 1000 {
		t.Fatalf("log: %v %v", st, err)
	}
	st1, err := os.Stat(p + ".1")
	if err != nil || st1.Size() > 1000 {
		t.Fatalf("rotated log: %v %v", st1, err)
	}
	b, _ := os.ReadFile(p)
	line, _, _ := strings.Cut(string(b), "\n")
	var e AuditEntry
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Sandbox != "sbx-1" || e.Result != "injected" || e.Time.IsZero() {
		t.Fatalf("entry %q: %v", line, err)
	}
}

func TestSandboxSecretsCA(t *testing.T) {
	ss, err := NewSandboxSecrets("sbx-1", "org", []Injection{{Host: "api.example.test", Header: "Authorization", Placeholder: tPlace, Value: tValue, Secret: "s/p"}}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ss.CACertPEM(), []byte("PRIVATE")) {
		t.Fatal("CA PEM holds a key")
	}
	leaf, err := ss.leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ss.CACert())
	lc, _ := x509.ParseCertificate(leaf.Certificate[0])
	if _, err := lc.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.test"}); err != nil {
		t.Fatalf("leaf does not verify: %v", err)
	}
	// The CA is name-constrained: a certificate it signed for another host does not verify.
	ss.Hosts = append(ss.Hosts, "other.example.test") // as if it were asked to
	other, err := ss.leaf("other.example.test")
	if err != nil {
		t.Fatal(err)
	}
	oc, _ := x509.ParseCertificate(other.Certificate[0])
	if _, err := oc.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.example.test"}); err == nil {
		t.Fatal("name constraint not enforced")
	}
	p1, _ := NewPlaceholder()
	p2, _ := NewPlaceholder()
	if p1 == p2 || !strings.HasPrefix(p1, PlaceholderPrefix) || len(p1) != len(PlaceholderPrefix)+32 {
		t.Fatalf("placeholders %q %q", p1, p2)
	}
}
