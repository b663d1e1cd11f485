package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
)

// dnsEnv is a DNS forwarder on loopback (UDP and TCP on one port) relaying to upstreams
// in an egresstest Internet, whose own server knows www.example.test.
type dnsEnv struct {
	in   *egresstest.Internet
	www  netip.Addr
	addr string // the forwarder's UDP and TCP address
	// Upstreams that fail: nothing listens at dead; blackhole reads and never answers;
	// servfail answers every query with SERVFAIL.
	dead, blackhole, servfail netip.AddrPort
	dns                       *DNS // steer_test.go's steering DNS
}

func newDNSEnv(t *testing.T) *dnsEnv {
	t.Helper()
	in := egresstest.New(t)
	e := &dnsEnv{in: in, www: in.Addr(t)}
	in.SetA("www.example.test", e.www)
	e.dead = netip.AddrPortFrom(in.Addr(t), 53)
	e.blackhole = netip.AddrPortFrom(in.Addr(t), 53)
	pc, err := in.ListenPacket("udp", e.blackhole.String())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, readerOf(pc)) }()
	l, err := in.Listen("tcp", e.blackhole.String())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }() // reads, never answers; closed with l's namespace
		}
	}()
	e.servfail = netip.AddrPortFrom(in.Addr(t), 53)
	sf, err := in.ListenPacket("udp", e.servfail.String())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := sf.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = sf.WriteTo(servFail(buf[:n]), from)
		}
	}()
	return e
}

// readerOf reads a PacketConn's datagrams as a stream (for draining it).
func readerOf(pc net.PacketConn) io.Reader {
	return readerFunc(func(p []byte) (int, error) { n, _, err := pc.ReadFrom(p); return n, err })
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// start serves d on a fresh loopback port, UDP and TCP.
func (e *dnsEnv) start(t *testing.T, d *DNS) {
	t.Helper()
	// One port for both, as a resolver expects; retried in the unlikely case the TCP
	// port is taken.
	for range 10 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			continue
		}
		e.addr = pc.LocalAddr().String()
		errs := make(chan error, 2)
		go func() { errs <- d.ServeUDP(pc) }()
		go func() { errs <- d.ServeTCP(l) }()
		t.Cleanup(func() {
			_ = d.Close()
			for range 2 {
				// ErrClosed: Close came before the Serve goroutine got going.
				if err := <-errs; err != nil && !errors.Is(err, net.ErrClosed) {
					t.Errorf("serve: %v", err)
				}
			}
		})
		return
	}
	t.Fatal("no free port for UDP and TCP")
}

// query sends one A query with id for name to the forwarder over network.
func (e *dnsEnv) query(t *testing.T, network string, id uint16, name string) dnsmessage.Message {
	t.Helper()
	q := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return raw(t, network, e.addr, b)
}

func answerA(m dnsmessage.Message) []netip.Addr {
	var out []netip.Addr
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			out = append(out, netip.AddrFrom4(r.A))
		}
	}
	return out
}

// TestDNS: queries over UDP and TCP reach the upstream and come back with their ID;
// upstreams are tried in order past dead, silent and SERVFAIL ones; with none left
// the client gets a SERVFAIL for its own question at once.
func TestDNS(t *testing.T) {
	e := newDNSEnv(t)
	good := e.in.DNS.String()
	for _, tc := range []struct {
		name      string
		upstreams []string
		rcode     dnsmessage.RCode
		minTime   time.Duration // the time the failed upstreams must cost, at least
		upQueries int64         // queries the good upstream sees (per network)
	}{
		{"one upstream", []string{good}, dnsmessage.RCodeSuccess, 0, 1},
		{"first upstream dead", []string{e.dead.String(), good}, dnsmessage.RCodeSuccess, 0, 1},
		{"first upstream silent", []string{e.blackhole.String(), good}, dnsmessage.RCodeSuccess, 300 * time.Millisecond, 1},
		{"dead and silent first", []string{e.dead.String(), e.blackhole.String(), good}, dnsmessage.RCodeSuccess, 300 * time.Millisecond, 1},
		{"no upstream answers", []string{e.dead.String(), e.blackhole.String()}, dnsmessage.RCodeServerFailure, 300 * time.Millisecond, 0},
		{"no upstreams", nil, dnsmessage.RCodeServerFailure, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.start(t, &DNS{Upstreams: tc.upstreams, Timeout: 300 * time.Millisecond})
			for i, network := range []string{"udp", "tcp"} {
				before := e.in.Queries()
				start := time.Now()
				id := uint16(0xbe00 + i)
				m := e.query(t, network, id, "www.example.test")
				el := time.Since(start)
				if m.ID != id || !m.Response || m.RCode != tc.rcode {
					t.Fatalf("%s: reply ID %#x response %v rcode %v; want ID %#x, %v", network, m.ID, m.Response, m.RCode, id, tc.rcode)
				}
				if len(m.Questions) != 1 || m.Questions[0].Name.String() != "www.example.test." {
					t.Errorf("%s: question %v not echoed", network, m.Questions)
				}
				if tc.rcode == dnsmessage.RCodeSuccess {
					if got := answerA(m); len(got) != 1 || got[0] != e.www {
						t.Errorf("%s: answers %v, want [%s]", network, got, e.www)
					}
				}
				if el < tc.minTime || el > tc.minTime+2*time.Second {
					t.Errorf("%s: took %v, want %v plus a little", network, el, tc.minTime)
				}
				if got := e.in.Queries() - before; got != tc.upQueries {
					t.Errorf("%s: upstream answered %d queries, want %d", network, got, tc.upQueries)
				}
			}
		})
	}
}

// TestDNSServfailUpstream: a SERVFAIL moves on to the next upstream; when it is the only
// answer there is, it is what the client gets.
func TestDNSServfailUpstream(t *testing.T) {
	e := newDNSEnv(t)
	for _, tc := range []struct {
		upstreams []string
		rcode     dnsmessage.RCode
	}{
		{[]string{e.servfail.String(), e.in.DNS.String()}, dnsmessage.RCodeSuccess},
		{[]string{e.servfail.String(), e.dead.String()}, dnsmessage.RCodeServerFailure},
	} {
		t.Run(fmt.Sprint(tc.upstreams), func(t *testing.T) {
			e.start(t, &DNS{Upstreams: tc.upstreams, Timeout: 300 * time.Millisecond})
			m := e.query(t, "udp", 7, "www.example.test")
			if m.ID != 7 || m.RCode != tc.rcode {
				t.Fatalf("ID %d rcode %v, want 7, %v", m.ID, m.RCode, tc.rcode)
			}
		})
	}
}

// TestDNSResolver: Go's resolver, as a sandbox's would, over UDP and TCP, many queries at
// once, including a name the upstream does not know (NXDOMAIN passes through).
func TestDNSResolver(t *testing.T) {
	e := newDNSEnv(t)
	e.start(t, &DNS{Upstreams: []string{e.in.DNS.String()}})
	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, e.addr)
		}}
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				got, err := r.LookupNetIP(context.Background(), "ip4", "www.example.test")
				if err != nil || len(got) != 1 || got[0] != e.www {
					t.Errorf("%s: %v, %v; want [%s]", network, got, err, e.www)
				}
			})
		}
		wg.Wait()
		_, err := r.LookupNetIP(context.Background(), "ip4", "nope.example.test")
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound {
			t.Errorf("%s: unknown name: %v, want not found", network, err)
		}
	}
}

// TestDNSTCPPipelined: several queries on one TCP connection are answered in order.
func TestDNSTCPPipelined(t *testing.T) {
	e := newDNSEnv(t)
	e.start(t, &DNS{Upstreams: []string{e.in.DNS.String()}})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var all []byte
	for id := range uint16(3) {
		q := dnsmessage.Message{
			Header:    dnsmessage.Header{ID: 100 + id},
			Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName("www.example.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
		}
		b, _ := q.Pack()
		all = binary.BigEndian.AppendUint16(all, uint16(len(b)))
		all = append(all, b...)
	}
	if _, err := c.Write(all); err != nil { // all three in one segment
		t.Fatal(err)
	}
	for id := range uint16(3) {
		resp, err := readTCPMsg(c)
		if err != nil {
			t.Fatal(err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil || m.ID != 100+id || len(answerA(m)) != 1 {
			t.Fatalf("reply %d: ID %d answers %v err %v", id, m.ID, answerA(m), err)
		}
	}
}

// TestDNSIgnoresNonQueries: replies and runts sent to the forwarder are not relayed.
func TestDNSIgnoresNonQueries(t *testing.T) {
	e := newDNSEnv(t)
	e.start(t, &DNS{Upstreams: []string{e.in.DNS.String()}})
	c, err := net.Dial("udp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := e.in.Queries()
	reply := servFail(mustPack(t, 9, "www.example.test."))
	for _, m := range [][]byte{reply, {1, 2, 3}} {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 512)); err == nil {
		t.Errorf("got a %d-byte answer", n)
	}
	if got := e.in.Queries() - before; got != 0 {
		t.Errorf("upstream saw %d queries", got)
	}
}

func mustPack(t *testing.T, id uint16, name string) []byte {
	q := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
