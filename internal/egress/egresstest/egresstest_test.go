package egresstest

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

func TestInternet(t *testing.T) {
	in := New(t)
	a, b := in.Addr(t), in.Addr(t)
	if !in.Prefix.Contains(a) || !in.Prefix.Contains(b) || a == b {
		t.Fatalf("addresses %s, %s not distinct in %s", a, b, in.Prefix)
	}
	in.SetA("www.example.test", a, netip.MustParseAddr("2001:db8::1"))
	ctx := context.Background()
	got, err := in.Resolver().LookupNetIP(ctx, "ip4", "www.example.test")
	if err != nil || len(got) != 1 || got[0] != a {
		t.Fatalf("lookup: %v, %v; want [%s]", got, err, a)
	}
	if _, err := in.Resolver().LookupNetIP(ctx, "ip4", "nope.example.test"); err == nil {
		t.Error("unknown name resolved")
	}
	srv := in.ServeHTTPS(t, a, "www.example.test")
	tr := &http.Transport{TLSClientConfig: in.ClientConfig("www.example.test")}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + a.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "server=" + a.String(); !strings.HasPrefix(string(body), want) {
		t.Errorf("body %q, want %q…", body, want)
	}
	if srv.Conns() != 1 {
		t.Errorf("server saw %d connections, want 1", srv.Conns())
	}
}

// TestCleanup: the namespace, the host's veth end and the route are gone after the test.
func TestCleanup(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces") // New's skip would end only "inner"
	var in *Internet
	t.Run("inner", func(t *testing.T) {
		in = New(t)
		in.ServeHTTPS(t, in.Addr(t), "x.example.test")
	})
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), in.NS+" ") || strings.Contains(string(out), in.NS+"\n") {
		t.Errorf("namespace %s left behind", in.NS)
	}
	if exec.Command("ip", "link", "show", in.hostIf).Run() == nil {
		t.Errorf("interface %s left behind", in.hostIf)
	}
	if out, _ := exec.Command("ip", "route", "show", in.Prefix.String()).Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("route left behind: %s", out)
	}
}

// TestTwo: Internets at the same time get /24s of their own.
func TestTwo(t *testing.T) {
	a, b := New(t), New(t)
	if a.Prefix.Overlaps(b.Prefix) || a.NS == b.NS {
		t.Fatalf("both got %s", a.Prefix)
	}
	a.SetA("a.example.test", a.Addr(t))
	if _, err := b.Resolver().LookupNetIP(context.Background(), "ip4", "a.example.test"); err == nil {
		t.Error("b's DNS answers a's name")
	}
}
