package egress

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS steering: where no redirect exists (the Kubernetes backend: a Pod's traffic cannot
// be DNATed without privilege), a sandbox finds the proxy by name. Its only nameserver
// is this DNS, which answers A and AAAA for a name the sandbox's host-name rules grant
// with the proxy's address; the client then connects there with that name as the TLS
// server name, which is what Proxy.handle reads and checks again. Every other name is
// relayed as by the plain DNS, so its real addresses come back and the sandbox's other
// rules (enforced outside it) decide whether it may connect.
//
// Every query comes from an untrusted sandbox: the source is checked first (a source
// that is no sandbox is REFUSED: this is not an open resolver for the cluster), then
// the message must be a standard query with exactly one question (FORMERR otherwise),
// and each source has a bounded number of queries in flight.

const (
	defaultSteerTTL       = 30 * time.Second
	defaultSteerPerSource = 64
	defaultSteerPerGroup  = 256 // a quarter of maxUDPInFlight: one organization never takes all
	steerTCPPerSource     = 8   // TCP connections of one source at once (UDP is the norm)
	steerTCPPerGroup      = 256 // TCP connections of one group at once (a quarter of maxTCPConns)
)

// Steering configures DNS.Steer. Set the fields before the first Serve.
type Steering struct {
	// Source returns the dns_name patterns granted to the sandbox at src and whether src
	// is a sandbox at all (false: the query is REFUSED). Required.
	Source func(src netip.Addr) (patterns []string, ok bool)
	// Proxy is what a granted name resolves to: its IPv4 addresses answer A queries, its
	// IPv6 ones AAAA queries (none of a family: no data).
	Proxy []netip.Addr
	// TTL of the synthesised answers; 0 = 30 s.
	TTL time.Duration
	// MaxPerSource bounds the queries of one source being answered at once; more are
	// dropped (the client retries). 0 = 64.
	MaxPerSource int
	// Group, when set, names the tenant (organization) of the sandbox at src: the
	// queries in flight and TCP connections of one group are bounded as well as those
	// of one source, so that one organization's many sandboxes cannot take every slot.
	Group func(src netip.Addr) string
	// MaxPerGroup bounds the queries of one group being answered at once (with Group);
	// 0 = 256. Its TCP connections are bounded at 256.
	MaxPerGroup int
}

func (st *Steering) group(src netip.Addr) (string, bool) {
	if st.Group == nil {
		return "", false
	}
	return st.Group(src), true
}

// answer returns the reply to query q from src (nil: none, the query is dropped).
func (d *DNS) answer(q []byte, src netip.Addr, network string) []byte {
	if d.Steer == nil {
		return d.exchange(q, network)
	}
	return d.steer(q, src, network)
}

func (d *DNS) steer(q []byte, src netip.Addr, network string) []byte {
	st := d.Steer
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil // not even a header: nothing to reply to
	}
	var patterns []string
	known := false
	if src.IsValid() && st.Source != nil {
		patterns, known = st.Source(src)
	}
	// The question is echoed when there is exactly one that parses.
	var question *dnsmessage.Question
	if binary.BigEndian.Uint16(q[4:6]) == 1 {
		if qq, err := p.Question(); err == nil {
			question = &qq
		}
	}
	switch {
	case !known:
		return steerReply(h, question, dnsmessage.RCodeRefused, nil, 0)
	case h.OpCode != 0:
		return steerReply(h, question, dnsmessage.RCodeNotImplemented, nil, 0)
	case question == nil:
		return steerReply(h, nil, dnsmessage.RCodeFormatError, nil, 0)
	}
	grp, grouped := st.group(src)
	if !d.enterSource(src, grp, grouped) {
		d.log().Warn("dns: too many queries in flight from one source or its organization, dropped one", "src", src, "group", grp)
		return nil
	}
	defer d.leaveSource(src, grp, grouped)
	name := strings.TrimSuffix(question.Name.String(), ".")
	if len(name) > maxNameLen || !grantedName(patterns, name) {
		return d.exchange(q, network)
	}
	if question.Class != dnsmessage.ClassINET {
		return steerReply(h, question, dnsmessage.RCodeSuccess, nil, 0)
	}
	var addrs []netip.Addr
	for _, a := range st.Proxy {
		a = a.Unmap()
		if question.Type == dnsmessage.TypeA && a.Is4() || question.Type == dnsmessage.TypeAAAA && a.Is6() {
			addrs = append(addrs, a)
		}
	}
	// Anything else, HTTPS and SVCB included, has no data: their address hints would
	// send a client to the real addresses, and an ECH config would make the outer
	// server name the provider's, which the proxy refuses.
	ttl := st.TTL
	if ttl <= 0 {
		ttl = defaultSteerTTL
	}
	return steerReply(h, question, dnsmessage.RCodeSuccess, addrs, uint32(ttl/time.Second))
}

func grantedName(patterns []string, name string) bool {
	for _, p := range patterns {
		if MatchName(p, name) {
			return true
		}
	}
	return false
}

func (d *DNS) enterSource(src netip.Addr, grp string, grouped bool) bool {
	limit := d.Steer.MaxPerSource
	if limit <= 0 {
		limit = defaultSteerPerSource
	}
	glimit := d.Steer.MaxPerGroup
	if glimit <= 0 {
		glimit = defaultSteerPerGroup
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[src] >= limit || grouped && d.inFlightGroup[grp] >= glimit {
		return false
	}
	if d.inFlight == nil {
		d.inFlight = make(map[netip.Addr]int)
	}
	d.inFlight[src]++
	if grouped {
		if d.inFlightGroup == nil {
			d.inFlightGroup = make(map[string]int)
		}
		d.inFlightGroup[grp]++
	}
	return true
}

func (d *DNS) leaveSource(src netip.Addr, grp string, grouped bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[src]--; d.inFlight[src] <= 0 {
		delete(d.inFlight, src) // the map holds only sources with queries in flight
	}
	if grouped {
		if d.inFlightGroup[grp]--; d.inFlightGroup[grp] <= 0 {
			delete(d.inFlightGroup, grp)
		}
	}
}

// steerReply builds a reply of the server's own; nil if it cannot be packed.
func steerReply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr, ttl uint32) []byte {
	m := dnsmessage.Message{Header: dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true, RCode: rcode,
	}}
	if q != nil {
		m.Questions = []dnsmessage.Question{*q}
		for _, a := range addrs {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}
			if a.Is4() {
				m.Answers = append(m.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AResource{A: a.As4()}})
			} else {
				m.Answers = append(m.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
			}
		}
	}
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// steerAdmit takes a TCP connection only from a known source with fewer than
// steerTCPPerSource connections (and whose group has fewer than steerTCPPerGroup); it
// closes any other at once, before reading it (a source that is no sandbox gets
// nothing, not even REFUSED; one sandbox or organization cannot hold the TCP slots of
// all). The group is remembered for steerRelease (the registry may change meanwhile).
func (d *DNS) steerAdmit(c net.Conn) bool {
	src := addrOf(c.RemoteAddr())
	if _, known := d.Steer.Source(src); !src.IsValid() || !known {
		_ = c.Close()
		return false
	}
	grp, grouped := d.Steer.group(src)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tcpBySrc[src] >= steerTCPPerSource || grouped && d.tcpByGroup[grp] >= steerTCPPerGroup {
		_ = c.Close()
		return false
	}
	if d.tcpBySrc == nil {
		d.tcpBySrc = make(map[netip.Addr]int)
	}
	d.tcpBySrc[src]++
	if grouped {
		if d.tcpByGroup == nil {
			d.tcpByGroup = make(map[string]int)
			d.tcpGroupOf = make(map[net.Conn]string)
		}
		d.tcpByGroup[grp]++
		d.tcpGroupOf[c] = grp
	}
	return true
}

// steerRelease undoes steerAdmit (nothing without Steer).
func (d *DNS) steerRelease(c net.Conn) {
	if d.Steer == nil {
		return
	}
	src := addrOf(c.RemoteAddr())
	d.mu.Lock()
	defer d.mu.Unlock()
	if grp, ok := d.tcpGroupOf[c]; ok {
		delete(d.tcpGroupOf, c)
		if d.tcpByGroup[grp]--; d.tcpByGroup[grp] <= 0 {
			delete(d.tcpByGroup, grp)
		}
	}
	if _, ok := d.tcpBySrc[src]; !ok {
		return
	}
	if d.tcpBySrc[src]--; d.tcpBySrc[src] <= 0 {
		delete(d.tcpBySrc, src)
	}
}
