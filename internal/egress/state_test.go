package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"
)

func stateSource(t *testing.T) *SandboxSecrets {
	t.Helper()
	ph1, _ := NewPlaceholder()
	ph2, _ := NewPlaceholder()
	src, err := NewSandboxSecrets("src", "org-a", []Injection{
		{Host: "api.example.com", Header: "Authorization", Placeholder: ph1, Value: "value-1", Secret: "prod/api#token"},
		{Host: "gh.example.com", Header: "X-Api-Key", Placeholder: ph2, Value: "value-2", Secret: "prod/gh"},
	}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestStateExportRestore: what Export hands another runner holds the CA and the
// placeholders but no value; Restore rebuilds secrets whose Fork, with the values resolved
// again, injects under the same placeholders and signs leaves the source's CA
// certificate verifies (the restored processes trust it). Lost secrets export nothing.
func TestStateExportRestore(t *testing.T) {
	src := stateSource(t)
	cert, key, injs, err := src.Export()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range injs {
		if in.Value != "" {
			t.Fatalf("exported injection carries a value: %+v", in)
		}
	}
	for _, b := range [][]byte{cert, key} {
		if strings.Contains(string(b), "value-1") || strings.Contains(string(b), "value-2") {
			t.Fatal("export holds a value")
		}
	}
	if src.Injections[0].Value != "value-1" {
		t.Fatal("Export changed the source")
	}
	got, err := Restore("moved", "org-a", cert, key, injs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if string(got.CACertPEM()) != string(src.CACertPEM()) || !slices.Equal(got.Hosts, src.Hosts) {
		t.Fatalf("restored CA or hosts differ: %v vs %v", got.Hosts, src.Hosts)
	}
	f, err := got.Fork("moved", "org-a", map[string]string{"prod/api#token": "new-1", "prod/gh": "new-2"}, time.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range f.Injections {
		if in.Placeholder != src.Injections[i].Placeholder || in.Value != "new-"+string(rune('1'+i)) {
			t.Fatalf("fork injection %d: %+v", i, in)
		}
	}
	leaf, err := f.leaf("gh.example.com")
	if err != nil {
		t.Fatal(err)
	}
	lc, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(src.CACert())
	if _, err := lc.Verify(x509.VerifyOptions{Roots: roots, DNSName: "gh.example.com"}); err != nil {
		t.Fatalf("a leaf of the restored CA does not verify against the source's certificate: %v", err)
	}
	if _, err := got.Fork("x", "org-a", map[string]string{"prod/api#token": "v"}, time.Now()); err == nil {
		t.Fatal("restored secrets forked without every value")
	}
	if _, _, _, err := LostSecrets("src", "org-a", src.Hosts).Export(); err == nil {
		t.Fatal("lost secrets exported")
	}
}

// TestStateRestoreRefusals: every malformed, oversized or inconsistent state another
// runner (or anything between) could hand over is refused, ErrInvalidState, naming why.
func TestStateRestoreRefusals(t *testing.T) {
	src := stateSource(t)
	cert, key, injs, err := src.Export()
	if err != nil {
		t.Fatal(err)
	}
	other := stateSource(t) // another sandbox's CA
	oCert, oKey, _, _ := other.Export()
	now := time.Now()

	// A CA made by hand: tmpl changed by mod, signed by signer (self when nil).
	mkCA := func(mod func(*x509.Certificate), signer *SandboxSecrets) ([]byte, []byte) {
		t.Helper()
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "ca"},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageCertSign,
			BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
			PermittedDNSDomainsCritical: true, PermittedDNSDomains: []string{"api.example.com", "gh.example.com"}}
		if mod != nil {
			mod(tmpl)
		}
		parent, pk := tmpl, any(k)
		if signer != nil {
			parent, pk = signer.CACert(), signer.caKey
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &k.PublicKey, pk)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalPKCS8PrivateKey(k)
		return der, kd
	}
	withInj := func(mod func(in []Injection) []Injection) []Injection {
		c := slices.Clone(injs)
		return mod(c)
	}
	type tc struct {
		cert, key []byte
		injs      []Injection
		now       time.Time
		want      string
	}
	cases := map[string]tc{
		"no cert":         {nil, key, injs, now, "CA certificate of 0 bytes"},
		"huge cert":       {make([]byte, MaxStateCACert+1), key, injs, now, "CA certificate of"},
		"huge key":        {cert, make([]byte, MaxStateCAKey+1), injs, now, "CA key of"},
		"no injections":   {cert, key, nil, now, "0 injections"},
		"too many":        {cert, key, make([]Injection, MaxStateInjections+1), now, "injections (1 to"},
		"value carried":   {cert, key, withInj(func(c []Injection) []Injection { c[0].Value = "leak"; return c }), now, "carries a value"},
		"upper-case host": {cert, key, withInj(func(c []Injection) []Injection { c[0].Host = "API.example.com"; return c }), now, "host"},
		"wildcard host":   {cert, key, withInj(func(c []Injection) []Injection { c[0].Host = "*.example.com"; return c }), now, "host"},
		"IP host":         {cert, key, withInj(func(c []Injection) []Injection { c[0].Host = "10.0.0.1"; return c }), now, "host"},
		"long host":       {cert, key, withInj(func(c []Injection) []Injection { c[0].Host = strings.Repeat("a.", 200) + "com"; return c }), now, "host"},
		"bad header":      {cert, key, withInj(func(c []Injection) []Injection { c[0].Header = "X-A\r\nHost"; return c }), now, "header"},
		"long header":     {cert, key, withInj(func(c []Injection) []Injection { c[0].Header = strings.Repeat("x", 65); return c }), now, "header"},
		"bad placeholder": {cert, key, withInj(func(c []Injection) []Injection { c[0].Placeholder = "Bearer x"; return c }), now, "placeholder"},
		"same placeholder": {cert, key, withInj(func(c []Injection) []Injection {
			c[1].Placeholder = c[0].Placeholder
			return c
		}), now, "placeholder repeated"},
		"same host and header": {cert, key, withInj(func(c []Injection) []Injection {
			c[1].Host, c[1].Header = c[0].Host, strings.ToLower(c[0].Header)
			return c
		}), now, "filled twice"},
		"no secret name":     {cert, key, withInj(func(c []Injection) []Injection { c[0].Secret = ""; return c }), now, "secret name"},
		"control in secret":  {cert, key, withInj(func(c []Injection) []Injection { c[0].Secret = "prod/a\nb"; return c }), now, "secret name"},
		"long secret":        {cert, key, withInj(func(c []Injection) []Injection { c[0].Secret = strings.Repeat("s", MaxStateSecretName+1); return c }), now, "secret name"},
		"garbage cert":       {[]byte("not DER"), key, injs, now, "CA certificate"},
		"garbage key":        {cert, []byte("not DER"), injs, now, "CA key"},
		"another CA's key":   {cert, oKey, injs, now, "not the certificate's key"},
		"another CA's cert":  {oCert, key, injs, now, "not the certificate's key"},
		"expired":            {cert, key, injs, src.CACert().NotAfter.Add(time.Second), "not valid now"},
		"not yet valid":      {cert, key, injs, src.CACert().NotBefore.Add(-time.Second), "not valid now"},
		"host not in the CA": {cert, key, withInj(func(c []Injection) []Injection { c[1].Host = "evil.example.com"; return c }), now, "name-constrained"},
		"one host fewer": {cert, key, withInj(func(c []Injection) []Injection {
			c[1].Host = c[0].Host
			return c
		}), now, "name-constrained"},
	}
	add := func(name string, mod func(*x509.Certificate), signer *SandboxSecrets, want string) {
		c, k := mkCA(mod, signer)
		cases[name] = tc{c, k, injs, now, want}
	}
	add("a well-made CA", nil, nil, "")
	add("not a CA", func(c *x509.Certificate) { c.IsCA = false; c.MaxPathLenZero = false }, nil, "not a CA")
	add("path length", func(c *x509.Certificate) { c.MaxPathLenZero = false; c.MaxPathLen = 3 }, nil, "not a CA")
	add("no cert-sign usage", func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }, nil, "not a CA")
	add("unconstrained", func(c *x509.Certificate) { c.PermittedDNSDomains = nil; c.PermittedDNSDomainsCritical = false }, nil, "name-constrained")
	add("constraint not critical", func(c *x509.Certificate) { c.PermittedDNSDomainsCritical = false }, nil, "name-constrained")
	add("wider constraint", func(c *x509.Certificate) { c.PermittedDNSDomains = append(c.PermittedDNSDomains, "bank.example") }, nil, "name-constrained")
	add("excluded names too", func(c *x509.Certificate) { c.ExcludedDNSDomains = []string{"x.example"} }, nil, "name-constrained")
	add("signed by another CA", nil, other, "not self-signed")
	for name, c := range cases {
		_, err := Restore("moved", "org-a", c.cert, c.key, c.injs, c.now)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (!errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
}
