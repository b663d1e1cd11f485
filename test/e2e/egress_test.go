package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// probe runs inside a sandbox: each check is a TLS handshake to port 443 (with or without
// SNI, to a name or a raw address), a DNS lookup or a plain TCP connect, reported as
// "ok:<first 16 hex of the server certificate's SHA-256>", "ok" or "fail:<why>".
const probe = `
import hashlib, json, socket, ssl, sys

def tls(host, ip=None, sni=True):
    try:
        s = socket.create_connection((ip or socket.gethostbyname(host), 443), timeout=4)
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        t = ctx.wrap_socket(s, server_hostname=host if sni else None)
        der = t.getpeercert(binary_form=True)
        t.close()
        return "ok:" + hashlib.sha256(der).hexdigest()[:16]
    except Exception as e:
        return "fail:%s %s" % (type(e).__name__, e)

def resolve(host):
    try:
        return socket.gethostbyname(host)
    except Exception as e:
        return "fail:%s %s" % (type(e).__name__, e)

def tcp(ip, port):
    try:
        socket.create_connection((ip, port), timeout=3).close()
        return "ok"
    except Exception as e:
        return "fail:%s %s" % (type(e).__name__, e)

granted, other = sys.argv[1], sys.argv[2]
print(json.dumps({
    "resolve granted": resolve("api.granted.test"),
    "resolve other": resolve("other.test"),
    "granted name": tls("api.granted.test"),
    "other name": tls("other.test"),
    "granted name, other's address": tls("api.granted.test", ip=other),
    "other's address, no SNI": tls("other.test", ip=other, sni=False),
    "other's address, port 80": tcp(other, 80),
}))
`

// TestOfficialClientEgress: through the official client, a sandbox granted one host name
// reaches that name's server and nothing else of a small "internet" (a network namespace
// with its own DNS and HTTPS servers); a deny_egress sandbox reaches nothing but the
// platform DNS; the platform default reaches both servers directly.
func TestOfficialClientEgress(t *testing.T) {
	if _, err := exec.Command("python3", "-c", "import cwsandbox").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the official client (pip install cwsandbox) is required in CI: %v", err)
		}
		t.Skip("the official client is not installed (pip install cwsandbox)")
	}
	in := egresstest.New(t)
	grantedIP, otherIP := in.Addr(t), in.Addr(t)
	in.SetA("api.granted.test", grantedIP)
	in.SetA("other.test", otherIP)
	granted := in.ServeHTTPS(t, grantedIP, "api.granted.test")
	other := in.ServeHTTPS(t, otherIP, "other.test")
	plain, err := in.Listen("tcp", otherIP.String()+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	fp := func(s *egresstest.Server) string {
		sum := sha256.Sum256(s.Cert.Raw)
		return "ok:" + hex.EncodeToString(sum[:])[:16]
	}

	// A stack whose sandboxes may leave the host, with the platform DNS forwarding to the
	// namespace's DNS server.
	dir := t.TempDir()
	cfg := env.StackConfig(dir)
	cfg.NoEgress = false
	cfg.Nameservers = []string{in.DNS.String()}
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Cleanup(func() { finish(t, s, dir) })
	g := startGatewayOn(t, s)

	script := `
import json, sys
from cwsandbox import EgressRule, NetworkOptions, Sandbox
probe, granted, other, image = sys.argv[1:5]
out = {}
for case, network in [
    ("dns_name", NetworkOptions(egress=[EgressRule(dns_name="api.granted.test")])),
    ("deny_egress", NetworkOptions(deny_egress=True)),
    ("default", None),
]:
    kw = {"network": network} if network else {}
    sb = Sandbox.run(container_image=image, **kw)
    sb.wait(timeout=60)
    r = sb.exec(["python3", "-c", probe, granted, other]).result()
    out[case] = {"effective": [str(e) for e in sb.effective_egress], "probe": json.loads(r.stdout) if r.returncode == 0 else r.stderr}
    sb.stop().result()
print(json.dumps(out))
`
	cmd := exec.Command("python3", "-c", script, probe, grantedIP.String(), otherIP.String(), env.Python())
	cmd.Env = append(os.Environ(), "CWSANDBOX_BASE_URL="+g.url, "CWSANDBOX_API_KEY="+g.keyA)
	stdout, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("official client: %v\n%s\n%s", err, stdout, stderr)
	}
	var got map[string]struct {
		Effective []string          `json:"effective"`
		Probe     map[string]string `json:"probe"`
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	const fail, ok = "fail:", "ok"
	want := map[string]map[string]string{
		"dns_name": {
			"resolve granted": grantedIP.String(),
			"resolve other":   otherIP.String(),
			"granted name":    fp(granted),
			"other name":      fail,
			// The proxy dials the name, not the address the packet was sent to: an
			// address alone buys nothing.
			"granted name, other's address": fp(granted),
			"other's address, no SNI":       fail,
			"other's address, port 80":      fail,
		},
		"deny_egress": {
			"resolve granted":               grantedIP.String(), // the platform DNS still answers
			"resolve other":                 otherIP.String(),
			"granted name":                  fail,
			"other name":                    fail,
			"granted name, other's address": fail,
			"other's address, no SNI":       fail,
			"other's address, port 80":      fail,
		},
		"default": { // any: the internet, reached directly
			"resolve granted":               grantedIP.String(),
			"resolve other":                 otherIP.String(),
			"granted name":                  fp(granted),
			"other name":                    fp(other),
			"granted name, other's address": fp(other),
			"other's address, no SNI":       fp(other),
			"other's address, port 80":      ok,
		},
	}
	for c, checks := range want {
		for check, w := range checks {
			g := got[c].Probe[check]
			if g != w && !(w == fail && strings.HasPrefix(g, fail)) {
				t.Errorf("%s: %s: got %q, want %q", c, check, g, w)
			}
		}
		t.Logf("%s: effective egress %v", c, got[c].Effective)
	}
	if n := len(got["deny_egress"].Effective); n != 0 {
		t.Errorf("deny_egress: effective egress %v, want none", got["deny_egress"].Effective)
	}
}
