//go:build linux

package network

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A sandbox's change — its elements and its own chains (rules.go) — goes to the kernel
// over netlink from this process, one batch = one nftables transaction, as atomic as
// `nft -f`, on a kept socket: a few hundred microseconds where spawning nft (which loads
// the ruleset into its cache first, and whose socket's close waits for the kernel) costs
// milliseconds, more the more sandboxes the table holds. The rules are the expressions
// nft compiles their text to (kernelRule, from the same description: rule.go), so the
// result is exactly what memberScript's script makes (TestElementsOverNetlink and
// TestRulesOverNetlink list the table after both and compare). One form nft makes is not
// written here: an anonymous interval set reaching the top of its range, which nft marks
// in element userdata that github.com/google/nftables cannot write; compile keeps such
// ranges out of sets (addrMatch, protoMatches), and a rule with one anyway is applied by
// nft (overNetlink).

// overNetlink: x's rules are ones setElements can apply (nil: none at all).
func (m *Manager) overNetlink(x *member) bool {
	if x == nil {
		return true
	}
	for _, rs := range [][]rule{x.egress, x.ingress, x.dnat} {
		for _, r := range rs {
			if _, _, ok := kernelRule(r); !ok {
				return false
			}
		}
	}
	return true
}

// anonSet is an anonymous constant set a rule looks up (nft's "{ … }").
type anonSet struct {
	key   nftables.SetDatatype
	elems []nftables.SetElement
	// interval: elems are interval starts and ends (IntervalEnd), as nft writes them
	interval bool
}

// kernelRule is r in the kernel's form, the expressions nft compiles r.String() to, and
// the anonymous sets they look up: a Lookup with no SetName looks up sets[SetID]. ok is
// false for a form it cannot write as nft does (an interval open at the top).
func kernelRule(r rule) (ex []expr.Any, sets []anonSet, ok bool) {
	ipv4 := false
	needIPv4 := func() { // nft's dependency of an ip payload in the inet family
		if !ipv4 {
			ex = append(ex, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}})
			ipv4 = true
		}
	}
	lookup := func(s anonSet, invert bool) {
		ex = append(ex, &expr.Lookup{SourceRegister: 1, SetID: uint32(len(sets)), Invert: invert})
		sets = append(sets, s)
	}
	for _, x := range r.match {
		offset := uint32(16) // ip daddr
		if x.saddr {
			offset = 12
		}
		switch x.kind {
		case nfprotoV4:
			needIPv4()
		case addrIn, addrNotIn:
			needIPv4()
			op := expr.CmpOpEq
			if x.kind == addrNotIn {
				op = expr.CmpOpNeq
			}
			if len(x.prefixes) == 1 { // nft makes a one-element set a comparison
				ex = append(ex, prefixCmp(offset, x.prefixes[0], op)...)
				continue
			}
			rs := make([][2]uint64, len(x.prefixes))
			for i, p := range x.prefixes {
				first, last := span(p)
				rs[i] = [2]uint64{first, last}
			}
			elems, closed := intervals(rs, 4)
			if !closed {
				return nil, nil, false
			}
			ex = append(ex, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4})
			lookup(anonSet{nftables.TypeIPAddr, elems, true}, true)
		case notReserved:
			needIPv4()
			ex = append(ex, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: "reserved", Invert: true})
		case callerMember:
			needIPv4()
			ex = append(ex, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 9}, // the 32-bit register after the address
				&expr.Lookup{SourceRegister: 1, SetName: "caller_member"})
		case dports:
			proto, known := l4proto(x.proto)
			if !known {
				return nil, nil, false // a protocol this code does not encode: nft's rule compiler
			}
			ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			switch p := x.ports; {
			case len(p) == 1 && p[0].lo == p[0].hi:
				ex = append(ex, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: portKey(p[0].lo)})
			case len(p) == 1:
				ex = append(ex, &expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: portKey(p[0].lo)},
					&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: portKey(p[0].hi)})
			default:
				rs, interval := make([][2]uint64, len(p)), false
				for i, q := range p {
					rs[i] = [2]uint64{uint64(q.lo), uint64(q.hi)}
					interval = interval || q.hi > q.lo
				}
				s := anonSet{key: nftables.TypeInetService, interval: interval}
				if interval {
					var closed bool
					if s.elems, closed = intervals(rs, 2); !closed {
						return nil, nil, false
					}
				} else {
					for _, q := range p {
						s.elems = append(s.elems, nftables.SetElement{Key: portKey(q.lo)})
					}
				}
				lookup(s, false)
			}
		case localDst:
			ex = append(ex, &expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
		default:
			return nil, nil, false
		}
	}
	switch {
	case r.dnat.IsValid():
		addr := r.dnat.Addr().As4()
		ex = append(ex, &expr.Immediate{Register: 1, Data: addr[:]},
			&expr.Immediate{Register: 2, Data: portKey(r.dnat.Port())},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true})
	case r.verdict == "accept":
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictAccept})
	case r.verdict == "drop":
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictDrop})
	case r.verdict == "return":
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictReturn})
	default:
		return nil, nil, false
	}
	return ex, sets, true
}

// prefixCmp compares the address at offset with p as nft does: the prefix's whole bytes
// loaded and compared, or with a mask when it does not end on a byte.
func prefixCmp(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	addr := p.Addr().AsSlice()
	if p.Bits()%8 == 0 {
		n := uint32(p.Bits() / 8)
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n},
			&expr.Cmp{Op: op, Register: 1, Data: addr[:n]}}
	}
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: addr}}
}

// intervals is the elements of an interval set of the ranges rs (inclusive; size bytes,
// big endian) as nft writes them: the ranges merged, each a start and an end (the first
// value after it, flagged), and an end at 0 before a first range that does not start
// there. closed is false if a range reaches the top (nft marks it open in userdata).
func intervals(rs [][2]uint64, size int) (elems []nftables.SetElement, closed bool) {
	slices.SortFunc(rs, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	var merged [][2]uint64
	for _, r := range rs {
		if n := len(merged); n > 0 && r[0] <= merged[n-1][1]+1 {
			merged[n-1][1] = max(merged[n-1][1], r[1])
			continue
		}
		merged = append(merged, r)
	}
	key := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v)[8-size:] }
	top := uint64(1)<<(8*size) - 1
	for i, r := range merged {
		if i == 0 && r[0] != 0 {
			elems = append(elems, nftables.SetElement{Key: key(0), IntervalEnd: true})
		}
		if r[1] == top {
			return nil, false
		}
		elems = append(elems, nftables.SetElement{Key: key(r[0])}, nftables.SetElement{Key: key(r[1] + 1), IntervalEnd: true})
	}
	return elems, true
}

// l4proto is proto's protocol number; false for one it does not know (never TCP by default).
func l4proto(proto string) (byte, bool) {
	switch proto {
	case "tcp":
		return unix.IPPROTO_TCP, true
	case "udp":
		return unix.IPPROTO_UDP, true
	case "sctp":
		return unix.IPPROTO_SCTP, true
	}
	return 0, false
}

// setElements replaces the elements and chains of old with those of new in one netlink
// transaction, in memberScript's order. Caller holds pol.mu.
func (m *Manager) setElements(old, new *member) error {
	ops := appendElements(appendElements(nil, old, true), new, false)
	chains := chainsOf(old, new)
	if len(ops) == 0 && len(chains) == 0 {
		return nil
	}
	c, err := m.pol.conn()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	if err := m.queueChange(c, ops, chains, first(old, new).ip); err != nil {
		m.pol.dropConn(c) // with what was queued
		return fmt.Errorf("netlink: %w", err)
	}
	if err := c.Flush(); err != nil {
		m.pol.dropConn(c) // a fresh socket next time: nothing of a failed batch lingers
		return fmt.Errorf("netlink: %w", err)
	}
	m.pol.batches++
	return nil
}

func (m *Manager) queueChange(c *nftables.Conn, ops []elementOp, chains []chainChange, addr netip.Addr) error {
	table := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	for _, o := range ops {
		s := &nftables.Set{Table: table, Name: o.set, IsMap: o.el.Val != nil}
		var err error
		if o.del {
			err = c.SetDeleteElements(s, []nftables.SetElement{o.el})
		} else {
			err = c.SetAddElements(s, []nftables.SetElement{o.el})
		}
		if err != nil {
			return err
		}
	}
	ip := addr.As4()
	for _, cc := range chains {
		chain := &nftables.Chain{Table: table, Name: cc.prefix + ipHex(addr)}
		vmap := &nftables.Set{Table: table, Name: cc.vmap, IsMap: true}
		switch {
		case cc.has == nil:
			if err := c.SetDeleteElements(vmap, []nftables.SetElement{{Key: ip[:]}}); err != nil {
				return err
			}
			c.DelChain(chain)
			continue
		case cc.had != nil && sameRules(cc.had, cc.has): // the same rules
			continue
		case cc.had != nil:
			c.FlushChain(chain)
		default:
			c.AddChain(chain)
		}
		for _, r := range cc.has {
			ex, sets, ok := kernelRule(r)
			if !ok {
				return fmt.Errorf("rule %q has no netlink form", r)
			}
			// The rule's anonymous sets, named by the kernel, and its lookups of them.
			ex = slices.Clone(ex)
			for i, e := range ex {
				l, ok := e.(*expr.Lookup)
				if !ok || l.SetName != "" {
					continue
				}
				a := sets[l.SetID]
				s := &nftables.Set{Table: table, Anonymous: true, Constant: true, Interval: a.interval, KeyType: a.key}
				if err := c.AddSet(s, a.elems); err != nil {
					return err
				}
				ex[i] = &expr.Lookup{SourceRegister: l.SourceRegister, SetName: s.Name, SetID: s.ID, Invert: l.Invert}
			}
			c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: ex})
		}
		if cc.had == nil {
			if err := c.SetAddElements(vmap, []nftables.SetElement{{Key: ip[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain.Name}}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// closeConn closes the kept socket for good (Manager.Close).
func (p *policyState) closeConn() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.close()
}

// elementOp adds (or, del, deletes) one element of a set or map of the table.
type elementOp struct {
	set string
	del bool
	el  nftables.SetElement
}

// appendElements appends x's elements (memberScript's "elements"), keys and values in
// the kernel's encoding: each field of a concatenation padded to 4 bytes, addresses and
// ports in network byte order, marks in host byte order. del: keys only.
func appendElements(ops []elementOp, x *member, del bool) []elementOp {
	if x == nil {
		return ops
	}
	ip := x.ip.As4()
	for _, k := range []struct {
		mark         uint32
		ofMap, ports string
		peer         []Port
	}{{x.mark, "org_of", "peer", x.peer}, {x.cmark, "caller_of", "peer_user", x.peerU}} {
		if k.mark == 0 {
			continue
		}
		el := nftables.SetElement{Key: ip[:]}
		if !del {
			el.Val = binaryutil.NativeEndian.PutUint32(k.mark)
		}
		ops = append(ops, elementOp{k.ofMap, del, el})
		for _, p := range k.peer {
			ops = append(ops, elementOp{k.ports, del, nftables.SetElement{Key: concat(ip[:], protoKey(p.Proto), portKey(p.Port), binaryutil.NativeEndian.PutUint32(k.mark))}})
		}
	}
	if x.cmark != 0 {
		ops = append(ops, elementOp{"caller_member", del, nftables.SetElement{Key: concat(ip[:], binaryutil.NativeEndian.PutUint32(x.cmark))}})
	}
	return ops
}

// concat is a concatenation key: every field padded to a 4-byte register.
func concat(fields ...[]byte) []byte {
	var k []byte
	for _, f := range fields {
		k = append(k, f...)
		for len(k)%4 != 0 {
			k = append(k, 0)
		}
	}
	return k
}

func protoKey(proto string) []byte {
	if proto == "udp" {
		return []byte{17}
	}
	return []byte{6} // compile admits tcp and udp only
}

func portKey(port uint16) []byte { return binary.BigEndian.AppendUint16(nil, port) }

// pinsOverNetlink adds (del: deletes) p's elements of the bridge table's sets pins and
// ports (antispoof.go) in one netlink transaction on the pins' kept socket — what
// `add element` / `delete element` scripts did, without an nft process per sandbox.
// Caller holds pinMu.
func (m *Manager) pinsOverNetlink(p pin, del bool) error {
	mac, err := net.ParseMAC(p.mac)
	if err != nil || len(mac) != 6 || !p.ip.Is4() || len(p.veth) >= unix.IFNAMSIZ {
		return fmt.Errorf("pin %s: bad port, MAC or address", p.veth)
	}
	c, err := m.pinNl.conn()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	table := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyBridge}
	ifname := ifnameKey(p.veth)
	ip := p.ip.As4()
	pins := []nftables.SetElement{{Key: concat(ifname, mac, ip[:])}}
	ports := []nftables.SetElement{{Key: ifname}}
	pinSet, portSet := &nftables.Set{Table: table, Name: "pins"}, &nftables.Set{Table: table, Name: "ports"}
	if del { // the port leaves ports first
		err = errors.Join(c.SetDeleteElements(portSet, ports), c.SetDeleteElements(pinSet, pins))
	} else { // and joins it last
		err = errors.Join(c.SetAddElements(pinSet, pins), c.SetAddElements(portSet, ports))
	}
	if err != nil {
		m.pinNl.dropConn(c) // with what was queued
		return fmt.Errorf("netlink: %w", err)
	}
	if err := c.Flush(); err != nil {
		m.pinNl.dropConn(c)
		return fmt.Errorf("netlink: %w", err)
	}
	m.pinNl.batches++
	return nil
}

// ifnameKey is an ifname key as nft encodes it: the name, zero-padded to IFNAMSIZ.
func ifnameKey(name string) []byte {
	k := make([]byte, unix.IFNAMSIZ)
	copy(k, name)
	return k
}

// nlConn is a kept netlink socket for nftables batches and the lock-holder's state of
// it; its owner's mutex guards it.
type nlConn struct {
	nl      *nftables.Conn
	closed  bool
	batches int // transactions made (tests)
}

// conn returns the kept socket, opened now if need be (in the host namespace: a
// thread that enters another one is locked and discarded, see netns.go), or after close
// one for this batch only.
func (n *nlConn) conn() (*nftables.Conn, error) {
	if n.nl != nil {
		return n.nl, nil
	}
	if n.closed {
		return nftables.New()
	}
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, err
	}
	n.nl = c
	return c, nil
}

// dropConn closes c if it is the kept socket.
func (n *nlConn) dropConn(c *nftables.Conn) {
	if c == n.nl {
		_ = c.CloseLasting()
		n.nl = nil
	}
}

// close closes the kept socket for good.
func (n *nlConn) close() {
	n.closed = true
	if n.nl != nil {
		n.dropConn(n.nl)
	}
}
