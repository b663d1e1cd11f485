package gateway

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

func TestSourceAddr(t *testing.T) {
	trusted, err := ParseTrustedProxies("10.0.0.0/8, 192.0.2.1,2001:db8::/32")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, remote string
		xff          []string
		trusted      []netip.Prefix
		want         string // "" = unknown
	}{
		{"no proxies: the peer", "203.0.113.5:4000", nil, nil, "203.0.113.5"},
		{"no proxies: X-Forwarded-For ignored", "203.0.113.5:4000", []string{"198.51.100.1"}, nil, "203.0.113.5"},
		{"untrusted peer: X-Forwarded-For ignored (spoofing)", "203.0.113.5:4000", []string{"10.0.0.7"}, trusted, "203.0.113.5"},
		{"trusted peer without header", "10.1.2.3:4000", nil, trusted, "10.1.2.3"},
		{"trusted peer names the client", "10.1.2.3:4000", []string{"198.51.100.1"}, trusted, "198.51.100.1"},
		{"right-most untrusted wins over client-written entries", "10.1.2.3:4000", []string{"127.0.0.1, 8.8.8.8, 198.51.100.1"}, trusted, "198.51.100.1"},
		{"trusted hops skipped", "10.1.2.3:4000", []string{"198.51.100.1, 10.9.9.9", "192.0.2.1"}, trusted, "198.51.100.1"},
		{"all trusted: the left-most", "10.1.2.3:4000", []string{"10.5.5.5, 10.9.9.9"}, trusted, "10.5.5.5"},
		{"port and brackets", "10.1.2.3:4000", []string{"[2001:db9::1]:443"}, trusted, "2001:db9::1"},
		{"ipv4 with port", "10.1.2.3:4000", []string{"198.51.100.1:1234"}, trusted, "198.51.100.1"},
		{"mapped peer", "[::ffff:10.1.2.3]:4000", []string{"198.51.100.1"}, trusted, "198.51.100.1"},
		{"garbage: unknown", "10.1.2.3:4000", []string{"198.51.100.1, not-an-ip"}, trusted, ""},
		{"empty entry: unknown", "10.1.2.3:4000", []string{"198.51.100.1,"}, trusted, ""},
		{"zone: unknown", "10.1.2.3:4000", []string{"fe80::1%eth0"}, trusted, ""},
		{"garbage left of the caller is never reached", "10.1.2.3:4000", []string{"not-an-ip, 198.51.100.1"}, trusted, "198.51.100.1"},
		{"too many hops: unknown", "10.1.2.3:4000", []string{strings.Repeat("10.0.0.1,", maxForwardedHops) + "10.0.0.2"}, trusted, ""},
		{"bad peer", "pipe", nil, trusted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sourceAddr(tc.remote, tc.xff, tc.trusted)
			if (tc.want == "" && got.IsValid()) || (tc.want != "" && got != netip.MustParseAddr(tc.want)) {
				t.Errorf("caller %v, want %q", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"10.0.0.0/33", "host.example", "fe80::1%eth0", "::ffff:0.0.0.0/80"} {
		if _, err := ParseTrustedProxies(bad); err == nil {
			t.Errorf("--trusted-proxies %q accepted", bad)
		}
	}
	if ps, err := ParseTrustedProxies("::ffff:10.0.0.0/104, 192.0.2.7"); err != nil || len(ps) != 2 || ps[0] != netip.MustParsePrefix("10.0.0.0/8") || ps[1] != netip.MustParsePrefix("192.0.2.7/32") {
		t.Errorf("--trusted-proxies forms: %v %v", ps, err)
	}
	if ps, err := ParseTrustedProxies(""); err != nil || len(ps) != 0 {
		t.Errorf("empty --trusted-proxies: %v %v", ps, err)
	}
}

// mutablePolicy is one policy document for every runner, changeable.
type mutablePolicy struct {
	mu  sync.Mutex
	doc string
	rev int64
}

func (p *mutablePolicy) set(doc string) { p.mu.Lock(); p.doc = doc; p.rev++; p.mu.Unlock() }
func (p *mutablePolicy) Policy(context.Context, string) ([]byte, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []byte(p.doc), p.rev, nil
}

// clientFrom is an HTTP client whose connections come from the loopback address src.
func clientFrom(t *testing.T, src string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", "127.0.0.1:1") // probe that src can be bound at all
	if err != nil && strings.Contains(err.Error(), "cannot assign") {
		t.Skipf("cannot bind %s: %v", src, err)
	}
	if c != nil {
		c.Close()
	}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestSourceIPAllowlist: over the gateway's HTTP handler with a real runner on a fake
// backend and --trusted-proxies 127.0.0.2: the runner's allowlist (127.0.0.1) decides
// placement and every later call; a peer outside the trusted proxies is judged by its own
// address whatever X-Forwarded-For it sends; a trusted proxy's X-Forwarded-For is read
// right to left; the allowlist is read at each call (a change applies to existing
// sandboxes at once).
func TestSourceIPAllowlist(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := keys.Create("acme", auth.RoleUser, "acme")
	if err != nil {
		t.Fatal(err)
	}
	pol := &mutablePolicy{doc: `{"control_plane_access": {"source_ip_allowlist": ["127.0.0.1"]}}`}
	trusted, _ := ParseTrustedProxies("127.0.0.2")
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)}, Policies: pol,
		TrustedProxies: trusted, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	ctx := context.Background()

	type caller struct {
		name string
		sc   sandboxv1connect.SandboxServiceClient
		lc   statev1connect.SandboxStateServiceClient
		xff  string
	}
	from := func(src, xff string) caller {
		c := clientFrom(t, src)
		return caller{name: src + " X-Forwarded-For " + xff, sc: sandboxv1connect.NewSandboxServiceClient(c, srv.URL),
			lc: statev1connect.NewSandboxStateServiceClient(c, srv.URL), xff: xff}
	}
	hdr := func(c caller, h http.Header) {
		h.Set("Authorization", "Bearer "+key)
		if c.xff != "" {
			h.Set("X-Forwarded-For", c.xff)
		}
	}
	create := func(c caller) (string, error) {
		req := connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}}})
		hdr(c, req.Header())
		res, err := c.sc.CreateSandbox(ctx, req)
		if err != nil {
			return "", err
		}
		return res.Msg.GetSandboxId(), nil
	}
	// ops are the calls on an existing sandbox; each returns its error.
	ops := map[string]func(c caller, id string) error{
		"get": func(c caller, id string) error {
			req := connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id})
			hdr(c, req.Header())
			_, err := c.sc.GetSandbox(ctx, req)
			return err
		},
		"exec": func(c caller, id string) error {
			req := connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}})
			hdr(c, req.Header())
			_, err := c.sc.Exec(ctx, req)
			return err
		},
		"read file": func(c caller, id string) error {
			req := connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: "/etc/hostname"})
			hdr(c, req.Header())
			_, err := c.sc.ReadFile(ctx, req)
			return err
		},
		"lifetime": func(c caller, id string) error {
			req := connect.NewRequest(&statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 1}})
			hdr(c, req.Header())
			_, err := c.lc.UpdateSandboxLifetime(ctx, req)
			return err
		},
		"delete": func(c caller, id string) error {
			req := connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})
			hdr(c, req.Header())
			_, err := c.sc.DeleteSandbox(ctx, req)
			return err
		},
	}
	denied := func(what string, err error, seen string) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.SourceIPNotAllowed {
			t.Errorf("%s: %v, want PERMISSION_DENIED %s", what, err, apierr.SourceIPNotAllowed)
			return
		}
		if got := apierr.Info(err).GetMetadata()["source_ip"]; got != seen {
			t.Errorf("%s: source_ip %q, want %q", what, got, seen)
		}
		if !strings.Contains(err.Error(), seen) {
			t.Errorf("%s: the message does not name %s: %v", what, seen, err)
		}
	}

	allowed := []caller{from("127.0.0.1", ""), from("127.0.0.2", "127.0.0.1"), from("127.0.0.2", "203.0.113.9, 127.0.0.1")}
	refused := []struct {
		c    caller
		seen string
	}{
		{from("127.0.0.3", "127.0.0.1"), "127.0.0.3"},            // an untrusted peer's header is not believed
		{from("127.0.0.3", ""), "127.0.0.3"},                     // plain
		{from("127.0.0.2", ""), "127.0.0.2"},                     // the proxy itself
		{from("127.0.0.2", "127.0.0.1, 127.0.0.3"), "127.0.0.3"}, // the right-most untrusted entry
		{from("127.0.0.2", "127.0.0.1, junk"), "an unknown address"},
	}

	// Placement: no runner takes a create from a refused caller.
	for _, r := range refused {
		_, err := create(r.c)
		denied("create from "+r.c.name, err, r.seen)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "runner[r1].control_plane_access.source_ip_allowlist" {
			t.Errorf("create from %s: violations %v", r.c.name, vs)
		}
	}
	for _, a := range allowed {
		id, err := create(a)
		if err != nil {
			t.Fatalf("create from %s: %v", a.name, err)
		}
		if err := ops["get"](a, id); err != nil {
			t.Errorf("get from %s: %v", a.name, err)
		}
		for name, op := range ops {
			for _, r := range refused {
				denied(name+" from "+r.c.name, op(r.c, id), r.seen)
			}
		}
		if err := ops["delete"](a, id); err != nil {
			t.Errorf("delete from %s: %v", a.name, err)
		}
	}

	// The current policy counts: an existing sandbox's calls follow a change.
	id, err := create(allowed[0])
	if err != nil {
		t.Fatal(err)
	}
	pol.set(`{"control_plane_access": {"source_ip_allowlist": []}}`)
	denied("get after the allowlist emptied", ops["get"](allowed[0], id), "127.0.0.1")
	pol.set(`{"control_plane_access": {"source_ip_allowlist": ["127.0.0.0/24"]}}`)
	if err := ops["get"](refused[0].c, id); err != nil {
		t.Errorf("get after the allowlist widened: %v", err)
	}
	pol.set(`{}`)
	if err := ops["get"](refused[1].c, id); err != nil {
		t.Errorf("get without an allowlist: %v", err)
	}
}

// FuzzSourceAddr: sourceAddr never panics; a peer outside the trusted proxies is always
// the caller whatever the header says; otherwise the caller is unknown, the peer, or an
// address the header holds — never one of the trusted proxies unless every hop is one.
func FuzzSourceAddr(f *testing.F) {
	f.Add("10.1.2.3:4000", "198.51.100.1, 10.9.9.9")
	f.Add("203.0.113.5:1", "10.0.0.1")
	f.Add("10.0.0.1:1", "[2001:db8::1]:80,junk")
	f.Add("[::ffff:10.0.0.1]:1", "::ffff:1.2.3.4")
	trusted, _ := ParseTrustedProxies("10.0.0.0/8")
	f.Fuzz(func(t *testing.T, remote, xff string) {
		got := sourceAddr(remote, []string{xff}, trusted)
		peer := parseHop(remote)
		if !peer.IsValid() || !trusted[0].Contains(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: caller %v", remote, got)
			}
			return
		}
		if !got.IsValid() || got == peer {
			return
		}
		found := false
		for h := range strings.SplitSeq(xff, ",") {
			found = found || parseHop(strings.TrimSpace(h)) == got
		}
		if !found {
			t.Fatalf("caller %v is neither the peer nor in %q", got, xff)
		}
	})
}
