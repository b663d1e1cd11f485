package pki

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

// TestRunnerOwner: a runner's owner comes only from an explicit runner URI SAN: an
// organization's (RunnerURI) or the platform's mark (PlatformRunnerURI). A certificate
// with no runner URI belongs to nobody (the old code took it for the platform's), and
// a malformed or ambiguous one is refused.
func TestRunnerOwner(t *testing.T) {
	certWith := func(uris ...*url.URL) *x509.Certificate { return &x509.Certificate{URIs: uris} }
	spiffe := func(path string) *url.URL { return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: path} }

	org, id, platform, err := RunnerOwner(certWith(RunnerURI("org-b", "r1")))
	if err != nil || org != "org-b" || id != "r1" || platform {
		t.Errorf("organization's runner: %q %q %v %v", org, id, platform, err)
	}
	org, id, platform, err = RunnerOwner(certWith(PlatformRunnerURI("r1"), spiffe("/gateway/g")))
	if err != nil || org != "" || id != "r1" || !platform {
		t.Errorf("platform runner: %q %q %v %v", org, id, platform, err)
	}

	for name, tc := range map[string]struct {
		cert *x509.Certificate
		want error
	}{
		"no URI":               {certWith(), ErrNoRunnerIdentity},
		"a gateway's URI":      {certWith(spiffe("/gateway/r1")), ErrNoRunnerIdentity},
		"another trust domain": {certWith(&url.URL{Scheme: "spiffe", Host: "other", Path: "/platform-runner/r1"}), ErrNoRunnerIdentity},
		"no runner ID":         {certWith(spiffe("/runner/org-b")), ErrRunnerIdentity},
		"empty org":            {certWith(spiffe("/runner//r1")), ErrRunnerIdentity},
		"empty platform ID":    {certWith(spiffe("/platform-runner/")), ErrRunnerIdentity},
		"nested platform ID":   {certWith(spiffe("/platform-runner/a/b")), ErrRunnerIdentity},
		"two organizations":    {certWith(RunnerURI("a", "r1"), RunnerURI("b", "r1")), ErrRunnerIdentity},
		"an org and the mark":  {certWith(RunnerURI("a", "r1"), PlatformRunnerURI("r1")), ErrRunnerIdentity},
		"the mark twice":       {certWith(PlatformRunnerURI("r1"), PlatformRunnerURI("r2")), ErrRunnerIdentity},
	} {
		org, id, platform, err := RunnerOwner(tc.cert)
		if !errors.Is(err, tc.want) || org != "" || id != "" || platform {
			t.Errorf("%s: %q %q %v %v, want %v", name, org, id, platform, err, tc.want)
		}
	}
}

func TestNodeAgentRunner(t *testing.T) {
	certWith := func(uris ...*url.URL) *x509.Certificate { return &x509.Certificate{URIs: uris} }
	spiffe := func(path string) *url.URL { return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: path} }
	if id, ok := NodeAgentRunner(certWith(NodeAgentClientURI("r1"))); !ok || id != "r1" {
		t.Fatalf("%q %v", id, ok)
	}
	// Never taken for a runner's identity.
	if _, _, ok := RunnerIdentity(certWith(NodeAgentClientURI("r1"))); ok {
		t.Fatal("node-agent client URI read as a runner URI")
	}
	for name, c := range map[string]*x509.Certificate{
		"none":       certWith(),
		"runner URI": certWith(RunnerURI("org", "r1")),
		"two":        certWith(NodeAgentClientURI("r1"), NodeAgentClientURI("r2")),
		"empty":      certWith(spiffe("/node-agent-client/")),
		"nested":     certWith(spiffe("/node-agent-client/r1/x")),
		"other host": certWith(&url.URL{Scheme: "spiffe", Host: "evil", Path: "/node-agent-client/r1"}),
	} {
		if id, ok := NodeAgentRunner(c); ok {
			t.Errorf("%s: accepted as %q", name, id)
		}
	}
}

// FuzzNodeAgentRunner: whatever URIs a certificate carries, a runner ID is only returned
// from exactly one spiffe://sandboxd/node-agent-client/<id> URI, and never holds a slash,
// a query or a fragment.
func FuzzNodeAgentRunner(f *testing.F) {
	f.Add("spiffe://sandboxd/node-agent-client/runner-a", "")
	f.Add("spiffe://sandboxd/node-agent-client/a/b", "spiffe://sandboxd/runner/a")
	f.Add("spiffe://sandboxd/node-agent-client/a?x=1", "spiffe://sandboxd/node-agent-client/b")
	f.Add("spiffe://user@sandboxd/node-agent-client/a#f", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		var uris []*url.URL
		for _, s := range []string{a, b} {
			if u, err := url.Parse(s); err == nil && s != "" {
				uris = append(uris, u)
			}
		}
		id, ok := NodeAgentRunner(&x509.Certificate{URIs: uris})
		if !ok {
			return
		}
		if id == "" || strings.ContainsAny(id, "/?#") {
			t.Fatalf("runner id %q from %v", id, uris)
		}
		n := 0
		for _, u := range uris {
			if u.Scheme == "spiffe" && u.Host == "sandboxd" && strings.HasPrefix(u.Path, "/node-agent-client/") {
				n++
				if u.Path != "/node-agent-client/"+id {
					t.Fatalf("runner id %q from path %q", id, u.Path)
				}
			}
		}
		if n != 1 {
			t.Fatalf("runner id %q from %d node-agent URIs", id, n)
		}
	})
}
