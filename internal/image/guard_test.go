package image_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// listener counts the connections made to a TCP listener on 127.0.0.1.
func listener(t *testing.T) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepted
}

// TestRegistryRefused: references to loopback, link-local, the host's own addresses and
// the sandbox network are refused before any dial, unless configured.
func TestRegistryRefused(t *testing.T) {
	addr, accepted := listener(t)
	_, port, _ := net.SplitHostPort(addr)
	var hostAddr string
	for _, a := range reserved.HostAddrs() {
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			hostAddr = a.String()
			break
		}
	}
	subnet := netip.MustParsePrefix("10.88.0.0/16")
	s := openStore(t, image.Options{
		Insecure:  []string{"registry.configured.test:*"},
		Forbidden: func(a netip.Addr) bool { return subnet.Contains(a) || reserved.IsHostAddr(a) },
	})
	refs := []string{
		addr + "/x:1", "127.0.0.1:18080/x:1", "localhost:" + port + "/x", "localhost:1/x", "LOCALHOST:1/x",
		"registry.localhost:" + port + "/x", "[::1]:5000/x", "[::1]:" + port + "/x", "169.254.169.254/x", "169.254.169.254:80/latest/meta-data:1",
		"0.0.0.0:" + port + "/x", "[::ffff:127.0.0.1]:" + port + "/x", "10.88.0.1:5000/x", "10.88.3.4/x", "[fe80::1]:5000/x",
	}
	if hostAddr != "" {
		refs = append(refs, hostAddr+":"+port+"/x:1")
	}
	for _, ref := range refs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := s.Pull(ctx, ref, nil)
		cancel()
		if !errors.Is(err, image.ErrRegistryNotAllowed) {
			t.Errorf("Pull(%s) = %v, want ErrRegistryNotAllowed", ref, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Pull(%s) took %v: it dialled", ref, d)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached the host's listener", n)
	}
}

// TestRegistryRefusedAfterResolution: a registry name that resolves to a forbidden
// address is refused by the dialer (the check is on the address dialled), so a DNS
// answer cannot make the puller probe the host; a configured name is dialled.
func TestRegistryRefusedAfterResolution(t *testing.T) {
	addr, accepted := listener(t)
	_, port, _ := net.SplitHostPort(addr)
	lookups := map[string][]netip.Addr{
		"evil.example.test":    {netip.MustParseAddr("127.0.0.1")},
		"meta.example.test":    {netip.MustParseAddr("169.254.169.254")},
		"mixed.example.test":   {netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.2")},
		"sandbox.example.test": {netip.MustParseAddr("10.88.0.7")},
	}
	subnet := netip.MustParsePrefix("10.88.0.0/16")
	var looked atomic.Int32
	s := openStore(t, image.Options{
		Insecure:  []string{"localhost:" + port},
		Forbidden: func(a netip.Addr) bool { return subnet.Contains(a) },
		LookupIP: func(_ context.Context, host string) ([]netip.Addr, error) {
			looked.Add(1)
			if a, ok := lookups[host]; ok {
				return a, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
	})
	for _, host := range []string{"evil.example.test", "meta.example.test", "mixed.example.test", "sandbox.example.test"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.Pull(ctx, host+":"+port+"/x:1", nil)
		cancel()
		if !errors.Is(err, image.ErrRegistryNotAllowed) {
			t.Errorf("Pull(%s) = %v, want ErrRegistryNotAllowed", host, err)
		}
	}
	if looked.Load() == 0 {
		t.Fatal("the resolver hook was never asked: the guard is not in the dial path")
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections reached the host's listener through a name", n)
	}
	// The operator's registry is dialled even on loopback (the dev mirror is).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := s.Pull(ctx, "localhost:"+port+"/x:1", nil)
	cancel()
	if errors.Is(err, image.ErrRegistryNotAllowed) || err == nil {
		t.Errorf("configured registry: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for accepted.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if accepted.Load() == 0 {
		t.Error("the configured registry was not dialled")
	}
}

// TestConfiguredLoopbackRegistry: a loopback registry the operator configured (as
// insecure, as the dev test mirror is) serves pulls; so does a mirror on loopback for
// docker.io.
func TestConfiguredLoopbackRegistry(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	host := startRegistry(t, testimage.RegistryOptions{})
	if _, err := testimage.Push(host, "x/app:a", smallImage(t, "a")); err != nil {
		t.Fatal(err)
	}
	ctx := pullCtx(t)
	s := openStore(t, image.Options{Insecure: []string{host}})
	if _, err := s.Pull(ctx, host+"/x/app:a", nil); err != nil {
		t.Fatalf("configured loopback registry: %v", err)
	}
	if _, err := testimage.Push(host, "library/app:a", smallImage(t, "b")); err != nil {
		t.Fatal(err)
	}
	m := openStore(t, image.Options{Insecure: []string{}, Mirrors: map[string][]image.Mirror{"docker.io": {{Host: host, Insecure: true}}}})
	if _, err := m.Pull(ctx, "app:a", nil); err != nil {
		t.Fatalf("loopback mirror of docker.io: %v", err)
	}
	if _, err := m.Pull(ctx, host+"/x/app:a", nil); err != nil && !strings.Contains(err.Error(), "HTTP") {
		t.Logf("the mirror host named directly: %v", err)
	}
}
