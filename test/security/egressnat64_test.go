package security

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxd/sandboxd/internal/egress"
)

// TestEgressProxyRefusesNAT64: a granted host name whose DNS answer is only a NAT64 address
// embedding a reserved IPv4 address (64:ff9b::a9fe:a9fe is cloud metadata's
// 169.254.169.254 behind a translator; 64:ff9b:1::a00:1 is 10.0.0.1 in the local-use
// prefix) is not dialled by the egress proxy with its default reserved ranges: the
// sandbox's client is refused and no upstream connection is attempted. A public address
// in the same answer is still used. Before: the NAT64 prefixes were not reserved, and a
// runner host on a NAT64 network dialled them.
func TestEgressProxyRefusesNAT64(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []netip.Addr
		dialled []string // the upstreams the proxy may dial, in order
	}{
		{"metadata via the well-known prefix", []netip.Addr{netip.MustParseAddr("64:ff9b::a9fe:a9fe")}, nil},
		{"RFC 1918 via the local-use prefix", []netip.Addr{netip.MustParseAddr("64:ff9b:1::a00:1")}, nil},
		{"a public address beside it", []netip.Addr{netip.MustParseAddr("64:ff9b::a9fe:a9fe"), netip.MustParseAddr("2001:db8::7")},
			[]string{"[2001:db8::7]:443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resolver := aaaaResolver(t, tc.answers)
			var mu sync.Mutex
			var dialled []string
			p := &egress.Proxy{
				Grants:   func(netip.Addr) []string { return []string{"api.nat64.test"} },
				Resolver: resolver,
				Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					mu.Lock()
					dialled = append(dialled, addr)
					mu.Unlock()
					return nil, errors.New("the test dials nothing")
				},
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = p.Serve(l) }()
			t.Cleanup(func() { _ = p.Close() })

			c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			err = tls.Client(c, &tls.Config{ServerName: "api.nat64.test", InsecureSkipVerify: true}).Handshake()
			if err == nil {
				t.Fatal("the handshake succeeded; want the proxy to refuse")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(dialled) != len(tc.dialled) || (len(dialled) > 0 && dialled[0] != tc.dialled[0]) {
				t.Errorf("the proxy dialled %v, want %v", dialled, tc.dialled)
			}
		})
	}
}

// aaaaResolver is a resolver whose one server, on loopback, answers every AAAA question
// with answers and every other question with no records.
func aaaaResolver(t *testing.T, answers []netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:n]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			r := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true}, Questions: m.Questions}
			if q.Type == dnsmessage.TypeAAAA {
				for _, a := range answers {
					r.Answers = append(r.Answers, dnsmessage.Resource{
						Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 60},
						Body:   &dnsmessage.AAAAResource{AAAA: a.As16()},
					})
				}
			}
			out, err := r.Pack()
			if err != nil {
				continue
			}
			_, _ = pc.WriteTo(out, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}
