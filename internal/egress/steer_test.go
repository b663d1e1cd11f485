package egress

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// loopUpstream is a DNS server on loopback (UDP and TCP, one port) that answers every
// A query with 192.0.2.7 and counts the queries it saw: what "relayed" means, without
// root.
func loopUpstream(t testing.TB) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	reply := func(q []byte) []byte {
		var m dnsmessage.Message
		if m.Unpack(q) != nil || len(m.Questions) != 1 {
			return nil
		}
		n.Add(1)
		r := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true}, Questions: m.Questions}
		if m.Questions[0].Type == dnsmessage.TypeA {
			r.Answers = []dnsmessage.Resource{{
				Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Class: dnsmessage.ClassINET, TTL: 5},
				Body:   &dnsmessage.AResource{A: [4]byte{192, 0, 2, 7}},
			}}
		}
		b, _ := r.Pack()
		return b
	}
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
		t.Cleanup(func() { pc.Close(); l.Close() })
		go func() {
			buf := make([]byte, 4096)
			for {
				k, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				if b := reply(buf[:k]); b != nil {
					_, _ = pc.WriteTo(b, from)
				}
			}
		}()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					for {
						q, err := readTCPMsg(c)
						if err != nil {
							return
						}
						if b := reply(q); b == nil || writeTCPMsg(c, b) != nil {
							return
						}
					}
				}()
			}
		}()
		return pc.LocalAddr().String(), &n
	}
	t.Fatal("no free port for UDP and TCP")
	return "", nil
}

var (
	steerProxy4 = netip.MustParseAddr("10.96.0.53")
	steerProxy6 = netip.MustParseAddr("fd00:96::53")
)

// steerDNS is a steering DNS on loopback whose only sandbox is 127.0.0.1, granted
// api.granted.test and *.wild.test; known(false) makes every source unknown.
func steerDNS(t *testing.T, known bool) (*dnsEnv, *atomic.Int64) {
	up, n := loopUpstream(t)
	e := &dnsEnv{}
	e.dns = &DNS{Upstreams: []string{up}, Timeout: time.Second, Steer: &Steering{
		Proxy: []netip.Addr{steerProxy4, steerProxy6},
		Source: func(src netip.Addr) ([]string, bool) {
			if !known || src != netip.MustParseAddr("127.0.0.1") {
				return nil, false
			}
			return []string{"api.granted.test", "*.wild.test"}, true
		},
	}}
	e.start(t, e.dns)
	return e, n
}

func packQuery(t testing.TB, id uint16, op dnsmessage.OpCode, qs ...dnsmessage.Question) []byte {
	t.Helper()
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: id, OpCode: op, RecursionDesired: true}, Questions: qs}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func question(name string, typ dnsmessage.Type) dnsmessage.Question {
	return dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}
}

// raw sends b over network to addr and returns the parsed reply.
func raw(t *testing.T, network, addr string, b []byte) dnsmessage.Message {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var resp []byte
	if network == "tcp" {
		if err := writeTCPMsg(c, b); err != nil {
			t.Fatal(err)
		}
		if resp, err = readTCPMsg(c); err != nil {
			t.Fatal(err)
		}
	} else {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		resp = buf[:n]
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		t.Fatal(err)
	}
	return m
}

func answerAddrs(m dnsmessage.Message) []netip.Addr {
	var out []netip.Addr
	for _, a := range m.Answers {
		switch r := a.Body.(type) {
		case *dnsmessage.AResource:
			out = append(out, netip.AddrFrom4(r.A))
		case *dnsmessage.AAAAResource:
			out = append(out, netip.AddrFrom16(r.AAAA))
		}
	}
	return out
}

// TestDNSAnswerGranted: a steering DNS answers A/AAAA of a name the source's host-name
// rules grant with the proxy's address (exact and wildcard grants, any case), gives no
// data for HTTPS/SVCB and other types of such names, relays every other name, refuses
// a source that is no sandbox, and answers FORMERR to anything but one question.
func TestDNSAnswerGranted(t *testing.T) {
	e, upstream := steerDNS(t, true)
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range []struct {
			name    string
			q       []byte
			rcode   dnsmessage.RCode
			want    []netip.Addr
			relayed bool
		}{
			{"A of a granted name", packQuery(t, 1, 0, question("api.granted.test.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{steerProxy4}, false},
			{"AAAA of a granted name", packQuery(t, 2, 0, question("api.granted.test.", dnsmessage.TypeAAAA)), dnsmessage.RCodeSuccess, []netip.Addr{steerProxy6}, false},
			{"upper case", packQuery(t, 3, 0, question("API.Granted.TEST.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{steerProxy4}, false},
			{"wildcard", packQuery(t, 4, 0, question("x.wild.test.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{steerProxy4}, false},
			{"HTTPS of a granted name", packQuery(t, 5, 0, question("api.granted.test.", dnsmessage.TypeHTTPS)), dnsmessage.RCodeSuccess, nil, false},
			{"SVCB of a granted name", packQuery(t, 6, 0, question("api.granted.test.", dnsmessage.TypeSVCB)), dnsmessage.RCodeSuccess, nil, false},
			{"TXT of a granted name", packQuery(t, 7, 0, question("x.wild.test.", dnsmessage.TypeTXT)), dnsmessage.RCodeSuccess, nil, false},
			{"wildcard is one label", packQuery(t, 8, 0, question("a.b.wild.test.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.7")}, true},
			{"wildcard is not the apex", packQuery(t, 9, 0, question("wild.test.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.7")}, true},
			{"not granted", packQuery(t, 10, 0, question("www.example.test.", dnsmessage.TypeA)), dnsmessage.RCodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.7")}, true},
			{"no question", packQuery(t, 11, 0), dnsmessage.RCodeFormatError, nil, false},
			{"two questions", packQuery(t, 12, 0, question("api.granted.test.", dnsmessage.TypeA), question("www.example.test.", dnsmessage.TypeA)), dnsmessage.RCodeFormatError, nil, false},
			{"not a query", packQuery(t, 13, 2, question("api.granted.test.", dnsmessage.TypeA)), dnsmessage.RCodeNotImplemented, nil, false},
		} {
			t.Run(network+"/"+tc.name, func(t *testing.T) {
				id := binary.BigEndian.Uint16(tc.q)
				before := upstream.Load()
				m := raw(t, network, e.addr, tc.q)
				if m.ID != id || !m.Response || m.RCode != tc.rcode {
					t.Fatalf("reply ID %d response %v rcode %v, want %d, %v", m.ID, m.Response, m.RCode, id, tc.rcode)
				}
				got := answerAddrs(m)
				if len(got) != len(tc.want) || len(got) > 0 && got[0] != tc.want[0] {
					t.Errorf("answers %v, want %v", got, tc.want)
				}
				if !tc.relayed && len(m.Answers) > 0 && m.Answers[0].Header.TTL != 30 {
					t.Errorf("TTL %d, want 30", m.Answers[0].Header.TTL)
				}
				if relayed := upstream.Load() > before; relayed != tc.relayed {
					t.Errorf("relayed upstream: %v, want %v", relayed, tc.relayed)
				}
			})
		}
	}

	t.Run("unknown source", func(t *testing.T) {
		e, upstream := steerDNS(t, false)
		for _, name := range []string{"api.granted.test.", "www.example.test."} {
			m := raw(t, "udp", e.addr, packQuery(t, 77, 0, question(name, dnsmessage.TypeA)))
			if m.RCode != dnsmessage.RCodeRefused || len(m.Answers) != 0 {
				t.Errorf("udp %s: rcode %v answers %v, want REFUSED and none", name, m.RCode, m.Answers)
			}
			// Over TCP the connection is closed before anything is read.
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_ = writeTCPMsg(c, packQuery(t, 78, 0, question(name, dnsmessage.TypeA)))
			if r, err := readTCPMsg(c); err == nil {
				t.Errorf("tcp %s: a reply %x to an unknown source", name, r)
			}
			c.Close()
		}
		if n := upstream.Load(); n != 0 {
			t.Errorf("the upstream saw %d queries of an unknown source", n)
		}
	})

	t.Run("TCP connections per source", func(t *testing.T) {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for range steerTCPPerSource {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		// The held ones are served.
		_ = held[0].SetDeadline(time.Now().Add(5 * time.Second))
		if err := writeTCPMsg(held[0], packQuery(t, 90, 0, question("api.granted.test.", dnsmessage.TypeA))); err != nil {
			t.Fatal(err)
		}
		if _, err := readTCPMsg(held[0]); err != nil {
			t.Fatalf("a held connection: %v", err)
		}
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_ = writeTCPMsg(c, packQuery(t, 91, 0, question("api.granted.test.", dnsmessage.TypeA)))
		if r, err := readTCPMsg(c); err == nil {
			t.Errorf("connection %d of one source answered: %x", steerTCPPerSource+1, r)
		}
		held[1].Close()
		waitFor(t, "a TCP slot to free", func() bool {
			e.dns.mu.Lock()
			defer e.dns.mu.Unlock()
			return e.dns.tcpBySrc[netip.MustParseAddr("127.0.0.1")] < steerTCPPerSource
		})
		if m := raw(t, "tcp", e.addr, packQuery(t, 92, 0, question("api.granted.test.", dnsmessage.TypeA))); len(m.Answers) != 1 {
			t.Errorf("after a slot freed: %+v", m)
		}
	})

	t.Run("per-source bound", func(t *testing.T) {
		up, upstream := loopUpstream(t)
		src, other := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")
		d := &DNS{Upstreams: []string{up}, Steer: &Steering{MaxPerSource: 3, Proxy: []netip.Addr{steerProxy4},
			Source: func(netip.Addr) ([]string, bool) { return []string{"api.granted.test"}, true }}}
		for range 3 {
			if !d.enterSource(src, "", false) {
				t.Fatal("a slot under the bound was refused")
			}
		}
		q := packQuery(t, 5, 0, question("www.example.test.", dnsmessage.TypeA))
		if r := d.steer(q, src, "udp"); r != nil {
			t.Errorf("a source at its bound got a reply")
		}
		if upstream.Load() != 0 {
			t.Errorf("a source at its bound was relayed")
		}
		if r := d.steer(q, other, "udp"); r == nil {
			t.Errorf("another source got no reply")
		}
		d.leaveSource(src, "", false)
		if r := d.steer(q, src, "udp"); r == nil {
			t.Errorf("no reply once a slot was free")
		}
		d.leaveSource(src, "", false)
		d.leaveSource(src, "", false)
		d.mu.Lock()
		left := len(d.inFlight)
		d.mu.Unlock()
		if left != 0 {
			t.Errorf("%d sources left in the in-flight map", left)
		}
	})

	// One organization's sandboxes together hold at most MaxPerGroup queries in flight:
	// a source under its own bound is dropped once its organization is at its bound,
	// another organization's is answered.
	t.Run("per-organization bound", func(t *testing.T) {
		up, upstream := loopUpstream(t)
		a1, a2, b1 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("10.0.0.7")
		d := &DNS{Upstreams: []string{up}, Steer: &Steering{MaxPerSource: 3, MaxPerGroup: 4, Proxy: []netip.Addr{steerProxy4},
			Source: func(netip.Addr) ([]string, bool) { return []string{"api.granted.test"}, true },
			Group: func(src netip.Addr) string {
				if src == b1 {
					return "org-b"
				}
				return "org-a"
			}}}
		for range 3 {
			if !d.enterSource(a1, "org-a", true) {
				t.Fatal("a slot under the bounds was refused")
			}
		}
		if !d.enterSource(a2, "org-a", true) {
			t.Fatal("a slot under the bounds was refused")
		}
		q := packQuery(t, 6, 0, question("www.example.test.", dnsmessage.TypeA))
		if r := d.steer(q, a2, "udp"); r != nil {
			t.Error("a source under its own bound got a reply while its organization is at its bound")
		}
		if upstream.Load() != 0 {
			t.Error("a query over the organization's bound was relayed")
		}
		if r := d.steer(q, b1, "udp"); r == nil {
			t.Error("another organization's source got no reply")
		}
		d.leaveSource(a1, "org-a", true)
		if r := d.steer(q, a2, "udp"); r == nil {
			t.Error("no reply once the organization had a free slot")
		}
		d.leaveSource(a1, "org-a", true)
		d.leaveSource(a1, "org-a", true)
		d.leaveSource(a2, "org-a", true)
		d.mu.Lock()
		left := len(d.inFlight) + len(d.inFlightGroup)
		d.mu.Unlock()
		if left != 0 {
			t.Errorf("%d entries left in the in-flight maps", left)
		}
	})
}

// FuzzDNSQuestion: whatever bytes a sandbox sends, the steering DNS does not panic, and
// a reply it builds is a response with the query's ID whose answers, if any, are the
// proxy's addresses.
func FuzzDNSQuestion(f *testing.F) {
	for _, q := range [][]byte{
		packQuery(f, 1, 0, question("api.granted.test.", dnsmessage.TypeA)),
		packQuery(f, 2, 0, question("x.wild.test.", dnsmessage.TypeAAAA)),
		packQuery(f, 3, 0),
		packQuery(f, 4, 0, question("a.test.", dnsmessage.TypeA), question("b.test.", dnsmessage.TypeA)),
		{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1}, // a pointer loop as the name
		{0, 1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0},
	} {
		f.Add(q)
	}
	d := &DNS{Steer: &Steering{Proxy: []netip.Addr{steerProxy4, steerProxy6},
		Source: func(netip.Addr) ([]string, bool) { return []string{"api.granted.test", "*.wild.test"}, true }}}
	src := netip.MustParseAddr("10.0.0.5")
	f.Fuzz(func(t *testing.T, q []byte) {
		if !isQuery(q) {
			return // never reaches steer (ServeUDP, serveConn)
		}
		r := d.steer(q, src, "udp") // no upstreams: a relayed query gets a SERVFAIL at once
		if r == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(r); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		if !m.Response || m.ID != binary.BigEndian.Uint16(q) {
			t.Fatalf("reply %+v is not a response to ID %d", m.Header, binary.BigEndian.Uint16(q))
		}
		for _, a := range answerAddrs(m) {
			if a != steerProxy4 && a != steerProxy6 {
				t.Fatalf("answer %s is not the proxy", a)
			}
		}
		if len(m.Questions) > 1 {
			t.Fatalf("%d questions echoed", len(m.Questions))
		}
	})
}
