//go:build linux

package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A change of a sandbox without ingress or dns_name chains, and whose egress chain (if
// any) is made of the rules the API's defaults give (drop or accept the sandbox subnet,
// accept "any", drop the rest: ruleExprs) goes to the kernel over netlink from this
// process, one batch = one nftables transaction, as atomic as `nft -f`, on a kept
// socket: a few hundred microseconds where spawning nft (which loads the ruleset into
// its cache first, and whose socket's close waits for the kernel) costs milliseconds.
// Other rules keep going through nft, whose rule compiler is not ours to rewrite. The
// result is exactly what memberScript's script makes (TestElementsOverNetlink lists
// the table after both and compares).

// overNetlink: x's rules are ones setElements can apply (nil: none at all).
func (m *Manager) overNetlink(x *member) bool {
	if x == nil {
		return true
	}
	if x.ingress != nil || x.dnat != nil {
		return false
	}
	for _, r := range x.egress {
		if m.ruleExprs(r) == nil {
			return false
		}
	}
	return true
}

// ruleExprs is the kernel form of an egress chain rule, as nft compiles it; nil for a
// rule it does not know.
func (m *Manager) ruleExprs(rule string) []expr.Any {
	daddr := func() []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		}
	}
	inSubnet := func() []expr.Any {
		sub := m.cfg.Subnet.Masked()
		addr := sub.Addr().As4()
		return append(daddr(),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(sub.Bits(), 32), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]})
	}
	drop, accept := &expr.Verdict{Kind: expr.VerdictDrop}, &expr.Verdict{Kind: expr.VerdictAccept}
	sub := "ip daddr " + m.cfg.Subnet.Masked().String()
	switch rule {
	case "drop":
		return []expr.Any{drop}
	case sub + " drop":
		return append(inSubnet(), drop)
	case sub + " accept": // same_org, every port
		return append(inSubnet(), accept)
	case "ip daddr != @reserved accept": // any, every port
		return append(daddr(), &expr.Lookup{SourceRegister: 1, SetName: "reserved", Invert: true}, accept)
	}
	return nil
}

// setElements replaces the elements of old with those of new in one netlink
// transaction. Caller holds pol.mu.
func (m *Manager) setElements(old, new *member) error {
	ops := appendElements(appendElements(nil, old, true), new, false)
	if len(ops) == 0 && (old == nil || old.egress == nil) && (new == nil || new.egress == nil) {
		return nil
	}
	c, err := m.pol.conn()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	table := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	for _, o := range ops {
		s := &nftables.Set{Table: table, Name: o.set, IsMap: o.el.Val != nil}
		if o.del {
			err = c.SetDeleteElements(s, []nftables.SetElement{o.el})
		} else {
			err = c.SetAddElements(s, []nftables.SetElement{o.el})
		}
		if err != nil {
			return err
		}
	}
	// The egress chain (memberScript's order: elements first).
	var had, has []string
	if old != nil {
		had = old.egress
	}
	if new != nil {
		has = new.egress
	}
	ip := first(old, new).ip.As4()
	chain := &nftables.Chain{Table: table, Name: "e" + ipHex(first(old, new).ip)}
	vmap := &nftables.Set{Table: table, Name: "egress_of", IsMap: true}
	switch {
	case had != nil && has == nil:
		if err := c.SetDeleteElements(vmap, []nftables.SetElement{{Key: ip[:]}}); err != nil {
			return err
		}
		c.DelChain(chain)
	case had != nil && slices.Equal(had, has): // the same rules
	case had != nil:
		c.FlushChain(chain)
	case has != nil:
		c.AddChain(chain)
	}
	if has != nil && !slices.Equal(had, has) {
		for _, r := range has {
			c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: m.ruleExprs(r)})
		}
		if had == nil {
			if err := c.SetAddElements(vmap, []nftables.SetElement{{Key: ip[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain.Name}}}); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		m.pol.dropConn(c) // a fresh socket next time: nothing of a failed batch lingers
		return fmt.Errorf("netlink: %w", err)
	}
	m.pol.batches++
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
