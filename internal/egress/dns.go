package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

const (
	defaultDNSTimeout = 2 * time.Second
	dnsTCPIdle        = 10 * time.Second // a TCP client silent this long is closed (RFC 7766 §6.2.3)
	maxUDPInFlight    = 1024             // queries relayed at once; more are dropped, the client retries
	maxTCPConns       = 1024             // TCP clients at once; more are closed (they can use UDP)
	dnsHeaderLen      = 12
)

// DNS forwards queries from sandboxes to upstream resolvers, over UDP and TCP, without
// interpreting them beyond what is needed: each message is relayed as is (the ID
// preserved), the reply checked only to belong to the query. When no upstream answers,
// the client gets a SERVFAIL at once rather than waiting out its own timeout.
//
// Set the fields before the first Serve and do not change them after.
type DNS struct {
	Upstreams []string      // "ip:port"; tried in order on failure/timeout
	Timeout   time.Duration // per upstream attempt; 0 = 2 s
	Log       *slog.Logger  // nil: slog.Default()
	// Steer, when set, makes this DNS the one through which host-name grants reach the
	// proxy (steer.go): only known sources are answered, and granted names resolve to
	// the proxy. nil: a pure relay (the local backend, where nftables redirects).
	Steer *Steering

	mu       sync.Mutex
	closed   bool
	open     map[io.Closer]struct{} // packet conns, listeners and TCP connections being served
	tcpConns int
	inFlight map[netip.Addr]int // Steer: queries being answered, by source
	tcpBySrc map[netip.Addr]int // Steer: TCP connections being served, by source
	// Steer.Group: queries in flight and TCP connections by group, and each admitted
	// TCP connection's group.
	inFlightGroup map[string]int
	tcpByGroup    map[string]int
	tcpGroupOf    map[net.Conn]string
	wg            sync.WaitGroup
}

// ServeUDP answers the queries arriving on pc until pc is closed (then it returns nil)
// or Close is called. Called after Close, it closes pc and returns net.ErrClosed.
func (d *DNS) ServeUDP(pc net.PacketConn) error {
	if !d.track(pc, false) {
		_ = pc.Close()
		return net.ErrClosed
	}
	defer d.untrack(pc)
	slots := make(chan struct{}, maxUDPInFlight)
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			if isTemporary(err) {
				continue
			}
			return fmt.Errorf("dns: read: %w", err)
		}
		if !isQuery(buf[:n]) {
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			d.log().Warn("dns: too many queries in flight, dropped one", "src", from)
			continue
		}
		if !d.begin() {
			<-slots
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			defer d.wg.Done()
			defer func() { <-slots }()
			resp := d.answer(q, addrOf(from), "udp")
			if resp == nil {
				return
			}
			if _, err := pc.WriteTo(resp, from); err != nil && !errors.Is(err, net.ErrClosed) {
				d.log().Info("dns: write reply", "src", from, "err", err)
			}
		}()
	}
}

// ServeTCP answers queries on the connections l accepts until l is closed (then it
// returns nil) or Close is called (called after Close: closes l, returns net.ErrClosed).
// Queries on one connection are answered in order.
func (d *DNS) ServeTCP(l net.Listener) error {
	if !d.track(l, false) {
		_ = l.Close()
		return net.ErrClosed
	}
	defer d.untrack(l)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("dns: accept: %w", err)
		}
		if d.Steer != nil && !d.steerAdmit(c) {
			continue // a source that is no sandbox, or one with too many connections
		}
		if !d.track(c, true) {
			if !d.isClosed() {
				d.log().Warn("dns: too many TCP clients, closed one", "src", c.RemoteAddr())
			}
			d.steerRelease(c)
			_ = c.Close()
			continue
		}
		go d.serveConn(c)
	}
}

func (d *DNS) serveConn(c net.Conn) {
	defer d.wg.Done()
	defer func() {
		_ = c.Close()
		d.mu.Lock()
		delete(d.open, c)
		d.tcpConns--
		d.mu.Unlock()
		d.steerRelease(c)
	}()
	for {
		_ = c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		q, err := readTCPMsg(c)
		if err != nil {
			return // EOF, idle, or garbage: nothing to answer
		}
		if !isQuery(q) {
			return
		}
		resp := d.answer(q, addrOf(c.RemoteAddr()), "tcp")
		if resp == nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
		if err := writeTCPMsg(c, resp); err != nil {
			return
		}
	}
}

// Close stops every Serve, closes the TCP connections being served and waits for the
// queries being relayed.
func (d *DNS) Close() error {
	d.mu.Lock()
	d.closed = true
	for c := range d.open {
		_ = c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
	return nil
}

func (d *DNS) track(c io.Closer, conn bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	if conn && d.tcpConns >= maxTCPConns {
		return false
	}
	if d.open == nil {
		d.open = make(map[io.Closer]struct{})
	}
	d.open[c] = struct{}{}
	if conn {
		d.tcpConns++
		d.wg.Add(1) // under mu: no Add races with Close's Wait
	}
	return true
}

func (d *DNS) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// begin counts a UDP query in wg unless closed.
func (d *DNS) begin() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.wg.Add(1)
	}
	return !d.closed
}

func (d *DNS) untrack(c io.Closer) {
	d.mu.Lock()
	delete(d.open, c)
	d.mu.Unlock()
}

func (d *DNS) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.Default()
}

// exchange relays q to the upstreams in order over network and returns the first
// reply that is not SERVFAIL or REFUSED (an upstream that cannot help), else the last
// such reply, else a SERVFAIL of its own; nil if q cannot even be answered that way.
func (d *DNS) exchange(q []byte, network string) []byte {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = defaultDNSTimeout
	}
	var last []byte
	for _, up := range d.Upstreams {
		resp, err := exchangeOne(q, network, up, timeout)
		if err != nil {
			d.log().Debug("dns: upstream failed", "upstream", up, "network", network, "err", err)
			continue
		}
		if rc := resp[3] & 0x0f; rc == byte(dnsmessage.RCodeServerFailure) || rc == byte(dnsmessage.RCodeRefused) {
			last = resp
			continue
		}
		return resp
	}
	if last != nil {
		return last
	}
	d.log().Info("dns: no upstream answered", "upstreams", d.Upstreams, "network", network)
	return servFail(q)
}

// exchangeOne sends q to one upstream and waits for its reply. Over UDP a fresh
// connected socket per query gives a random source port, and replies with another ID
// (stray or spoofed) are skipped.
func exchangeOne(q []byte, network, upstream string, timeout time.Duration) ([]byte, error) {
	c, err := net.DialTimeout(network, upstream, timeout)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if network == "tcp" {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		for {
			resp, err := readTCPMsg(c)
			if err != nil {
				return nil, fmt.Errorf("read: %w", err)
			}
			if isReplyTo(resp, q) {
				return resp, nil
			}
		}
	}
	if _, err := c.Write(q); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
		if isReplyTo(buf[:n], q) {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// isQuery: at least a header, QR clear (a reply sent to us is never relayed on).
func isQuery(m []byte) bool {
	return len(m) >= dnsHeaderLen && m[2]&0x80 == 0
}

// isReplyTo: a reply (QR set) with q's ID.
func isReplyTo(resp, q []byte) bool {
	return len(resp) >= dnsHeaderLen && resp[2]&0x80 != 0 && resp[0] == q[0] && resp[1] == q[1]
}

// servFail builds a SERVFAIL reply to q, echoing its question; nil if q does not parse.
func servFail(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil
	}
	m := dnsmessage.Message{
		Header: dnsmessage.Header{
			ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
			RecursionAvailable: true, RCode: dnsmessage.RCodeServerFailure,
		},
		Questions: qs,
	}
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	m := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, m); err != nil {
		return nil, err
	}
	return m, nil
}

func writeTCPMsg(w io.Writer, m []byte) error {
	if len(m) > 0xffff {
		return errors.New("dns: message longer than 65535 bytes")
	}
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}
