package egresstest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// SetA sets the addresses name resolves to (A records for IPv4, AAAA for IPv6),
// replacing earlier ones; no addresses removes the name (NXDOMAIN).
func (in *Internet) SetA(name string, addrs ...netip.Addr) {
	key := strings.ToLower(strings.TrimSuffix(name, "."))
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(addrs) == 0 {
		delete(in.records, key)
		return
	}
	in.records[key] = append([]netip.Addr(nil), addrs...)
}

// Queries is how many queries the DNS server has answered.
func (in *Internet) Queries() int64 { return in.queries.Load() }

// serveDNS answers on addr over UDP and TCP.
func (in *Internet) serveDNS(addr netip.AddrPort) error {
	pc, err := in.ListenPacket("udp", addr.String())
	if err != nil {
		return err
	}
	l, err := in.Listen("tcp", addr.String())
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if resp := in.answer(buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go in.serveDNSConn(c)
		}
	}()
	return nil
}

func (in *Internet) serveDNSConn(c net.Conn) {
	defer c.Close()
	for {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		resp := in.answer(q)
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the reply to query q; nil for what is not a one-question query.
func (in *Internet) answer(q []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(q); err != nil || m.Response || len(m.Questions) != 1 {
		return nil
	}
	in.queries.Add(1)
	question := m.Questions[0]
	reply := dnsmessage.Message{
		Header: dnsmessage.Header{
			ID: m.ID, Response: true, Authoritative: true,
			RecursionDesired: m.RecursionDesired, RecursionAvailable: true,
		},
		Questions: m.Questions,
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	in.mu.Lock()
	addrs, ok := in.records[name]
	in.mu.Unlock()
	if !ok {
		reply.RCode = dnsmessage.RCodeNameError
	}
	for _, a := range addrs {
		h := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 5}
		switch {
		case a.Is4() && question.Type == dnsmessage.TypeA:
			h.Type = dnsmessage.TypeA
			reply.Answers = append(reply.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AResource{A: a.As4()}})
		case a.Is6() && question.Type == dnsmessage.TypeAAAA:
			h.Type = dnsmessage.TypeAAAA
			reply.Answers = append(reply.Answers, dnsmessage.Resource{Header: h, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
		}
	}
	b, err := reply.Pack()
	if err != nil {
		return nil
	}
	return b
}
