package network

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Per-sandbox rules (SetRules), enforced on the host where nothing inside a sandbox can
// touch them.
//
// Sandboxes are isolated from each other at layer 2 (isolated bridge ports); the bridge
// answers ARP for every sandbox address (proxy ARP, private-VLAN style), so
// sandbox-to-sandbox packets are routed through the host and meet the forward chain:
//
//   - the destination's ingress side first: the (address, protocol, port, organization)
//     must be in set "peer": its PRIVATE ports, and the CUSTOM ports its same_org
//     ingress rules open, each tagged with its organization's number; the source's
//     number comes from map org_of (meta mark). Or the (address, protocol, port,
//     caller) is in set "peer_user": CUSTOM ports its same_user ingress rules open to
//     the sandboxes of the API key that created it (map caller_of). Nothing else of
//     another sandbox is reachable.
//   - then the source's egress side, as for any other destination: a same_org rule
//     accepts any sandbox that got this far (an API key belongs to one organization), a
//     same_user rule only those of its caller (set caller_member).
//
// Egress of a sandbox with a runtime.Network is one chain of its own, e<hex address>,
// reached through the verdict map egress_of keyed by source address: accept rules for
// its CIDR/any/same_org rules, then drop. A sandbox without one (nil Network: specs
// recorded before rules existed, or a warm-pool container) is in no map and keeps the
// old behaviour (everything but the host and other sandboxes, with Config.Egress).
// CUSTOM ports opened to CIDR/any sources outside the host are chain i<hex> (verdict
// map ingress_of keyed by destination address), and a sandbox with dns_name grants has
// chain n<hex> in nat prerouting (map dnat_of): its TCP 443 not already allowed by a
// CIDR/any rule is redirected to the SNI proxy on the gateway.
//
// A change touches only the sandbox's own elements and chains, so its cost does not
// grow with the number of sandboxes. Rules are persisted next to the attachment
// (rules/<id>.json) and New rebuilds the table with all of them in one transaction, so
// a restarted runner never leaves a sandbox with fewer restrictions than it had.
// Organizations are numbered per Manager (nftables wants fixed-size keys); New numbers
// them again from the persisted rules.

// Port is a sandbox port (a service) that rules open.
type Port struct {
	Proto string `json:"proto"` // "tcp" or "udp"
	Port  uint16 `json:"port"`
}

// Rules are what one sandbox may reach and what may reach it.
type Rules struct {
	// Org is the sandbox's organization ("" = none); Caller the API key that created it
	// (for same_user rules; "" = none).
	Org    string `json:"org,omitempty"`
	Caller string `json:"caller,omitempty"`
	// Private ports are reachable from the other sandboxes of Org (visibility "private").
	Private []Port `json:"private,omitempty"`
	// Custom ports are reachable as Network.Ingress says (visibility "custom").
	Custom []Port `json:"custom,omitempty"`
	// Network holds the effective egress and ingress rules. nil: no egress rules
	// (Config.Egress decides, as before rules existed) and Custom ports stay closed.
	Network *runtime.Network `json:"network,omitempty"`
}

// member is a sandbox's applied rules, compiled.
type member struct {
	ip      netip.Addr
	mark    uint32   // organization number; 0: none
	cmark   uint32   // caller number; 0: none
	peer    []Port   // opened to the organization
	peerU   []Port   // opened to the caller's sandboxes
	egress  []rule   // chain e…, nil: none (legacy)
	ingress []rule   // chain i…, nil: none
	dnat    []rule   // chain n…, nil: none
	grants  []string // dns_name patterns, for the proxy
	inject  []string // dns_name hosts with egress secrets, for the proxy
	// rules is the JSON of the Rules this member was compiled from: SetRules skips a
	// change to the rules in force, and only those (a change that failed left the old
	// member in force, so the same rules again are applied again, not skipped).
	rules string
}

type policyState struct {
	// grants are the dns_name patterns by sandbox address, read by the proxy for every
	// connection without waiting for rule changes.
	grants sync.Map // netip.Addr -> []string
	// injectHosts are the hosts with egress secrets by sandbox address (Secrets).
	injectHosts sync.Map // netip.Addr -> []string

	mu      sync.Mutex // serializes rule changes: nft transactions of one table
	orgs    map[string]uint32
	callers map[string]uint32
	members map[netip.Addr]*member
	// The netlink socket of setElements (nftnl.go), opened on first use and kept:
	// closing one costs milliseconds. nil after Close (closed).
	nlConn
}

// SetRules applies r to sandbox id (which must have been Setup) in one nftables
// transaction, replacing what was set before, and persists it for New. Teardown removes
// the rules.
func (m *Manager) SetRules(id string, r Rules) error {
	if err := validID(id); err != nil {
		return err
	}
	att, err := m.readRecord(id)
	if err != nil {
		return fmt.Errorf("network: rules of %s: %w", id, err)
	}
	p := &m.pol
	p.mu.Lock()
	defer p.mu.Unlock()
	want, err := json.Marshal(&r)
	if err != nil {
		return fmt.Errorf("network: rules of %s: %w", id, err)
	}
	// The same rules again (a restarted runner declaring what New restored): nothing to do.
	if cur := p.members[att.IP]; cur != nil && cur.rules == string(want) {
		return nil
	}
	mem, err := m.compile(att.IP, r)
	if err != nil {
		return fmt.Errorf("network: rules of %s: %w", id, err)
	}
	mem.rules = string(want)
	// Persisted first: a crash in between leaves New the rules meant, never fewer.
	if err := m.writeRules(id, &r); err != nil {
		return fmt.Errorf("network: rules of %s: %w", id, err)
	}
	if err := m.change(att.IP, mem); err != nil {
		return fmt.Errorf("network: rules of %s: %w", id, err)
	}
	return nil
}

// Grants returns the dns_name patterns of the sandbox at src (for the SNI proxy).
func (m *Manager) Grants(src netip.Addr) []string {
	if g, ok := m.pol.grants.Load(src.Unmap()); ok {
		return append([]string(nil), g.([]string)...)
	}
	return nil
}

// clearRules forgets the sandbox at ip (Teardown).
func (m *Manager) clearRules(id string, ip netip.Addr) error {
	p := &m.pol
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.members[ip] != nil {
		if err := m.change(ip, nil); err != nil {
			return fmt.Errorf("network: remove rules of %s: %w", id, err)
		}
	}
	if err := os.Remove(m.rulesPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// change replaces the rules of the sandbox at ip with mem (nil: none) with one
// transaction touching only that sandbox's elements and chains. Should that fail (the
// table was changed behind the Manager's back, e.g. by another Manager on it), the whole
// table is rebuilt from what this Manager knows, in one transaction too. Caller holds
// pol.mu.
func (m *Manager) change(ip netip.Addr, mem *member) error {
	p := &m.pol
	old := p.members[ip]
	var err error
	if m.overNetlink(old) && m.overNetlink(mem) { // in-process, see nftnl.go
		err = m.setElements(old, mem)
	} else {
		var b strings.Builder
		m.memberScript(&b, old, mem)
		if b.Len() > 0 { // nothing to change (no organization, no rules): no nft run
			err = runNft(b.String())
		}
	}
	if err == nil {
		p.set(ip, mem)
		return nil
	}
	p.set(ip, mem)
	if rerr := runNft(m.tableLocked()); rerr != nil {
		p.set(ip, old)
		return fmt.Errorf("nftables: %w (and rebuilding the table: %v)", err, rerr) //nolint:errorlint // one error to match is enough
	}
	return nil
}

// set records mem (nil: none) as the rules of the sandbox at ip. Caller holds mu.
func (p *policyState) set(ip netip.Addr, mem *member) {
	if mem == nil {
		delete(p.members, ip)
		p.grants.Delete(ip)
		p.injectHosts.Delete(ip)
		return
	}
	p.members[ip] = mem
	if len(mem.grants) > 0 {
		p.grants.Store(ip, mem.grants)
	} else {
		p.grants.Delete(ip)
	}
	if len(mem.inject) > 0 {
		p.injectHosts.Store(ip, mem.inject)
	} else {
		p.injectHosts.Delete(ip)
	}
}

// restoreRules compiles the persisted rules of every sandbox with a record (New). A
// record whose rules no longer compile gets a chain that drops everything rather than
// none, which would mean the old, open behaviour.
func (m *Manager) restoreRules() []*member {
	p := &m.pol
	p.orgs, p.callers, p.members = map[string]uint32{}, map[string]uint32{}, map[netip.Addr]*member{}
	ents, _ := os.ReadDir(m.rulesDir)
	var out []*member
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || validID(id) != nil {
			continue
		}
		att, err := m.readRecord(id)
		if err != nil || !att.IP.IsValid() {
			continue
		}
		var r Rules
		b, err := os.ReadFile(filepath.Join(m.rulesDir, e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		mem := (*member)(nil)
		if err == nil {
			mem, err = m.compile(att.IP, r)
		}
		if err == nil {
			if j, jerr := json.Marshal(&r); jerr == nil {
				mem.rules = string(j)
			}
		}
		if err != nil {
			mem = &member{ip: att.IP, egress: []rule{{verdict: "drop"}}}
		}
		p.set(att.IP, mem)
		out = append(out, mem)
	}
	return out
}

// table returns the script that rebuilds the whole table with the rules in force.
func (m *Manager) table() string {
	m.pol.mu.Lock()
	defer m.pol.mu.Unlock()
	return m.tableLocked()
}

func (m *Manager) tableLocked() string {
	members := make([]*member, 0, len(m.pol.members))
	for _, mem := range m.pol.members {
		members = append(members, mem)
	}
	return m.rules(members)
}

func (m *Manager) rulesPath(id string) string { return filepath.Join(m.rulesDir, id+".json") }

func (m *Manager) writeRules(id string, r *Rules) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(m.rulesPath(id), string(b)); err != nil {
		return fmt.Errorf("persist rules: %w", err)
	}
	return nil
}

// compile checks r and turns it into the sandbox's chains and elements. Caller holds
// pol.mu (organization numbers).
func (m *Manager) compile(ip netip.Addr, r Rules) (*member, error) {
	if !ip.Is4() || !m.cfg.Subnet.Contains(ip) {
		return nil, fmt.Errorf("%v is not a sandbox address", ip)
	}
	for _, ps := range [][]Port{r.Private, r.Custom} {
		for _, p := range ps {
			if (p.Proto != "tcp" && p.Proto != "udp") || p.Port == 0 {
				return nil, fmt.Errorf("invalid port %s/%d", p.Proto, p.Port)
			}
		}
	}
	mem := &member{ip: ip}
	number := func(names map[string]uint32, name string) uint32 {
		if name == "" {
			return 0
		}
		n, ok := names[name]
		if !ok {
			n = uint32(len(names) + 1)
			names[name] = n
		}
		return n
	}
	mem.mark = number(m.pol.orgs, r.Org)
	mem.cmark = number(m.pol.callers, r.Caller)
	mem.peer = append(mem.peer, r.Private...)
	n := r.Network
	if n == nil {
		mem.peer = dedupPorts(mem.peer)
		return mem, nil
	}
	// Egress.
	toSub := match{kind: addrIn, prefixes: []netip.Prefix{m.cfg.Subnet.Masked()}}
	var toPeers, out, keep443 []rule
	for i, e := range n.Egress {
		if n.DenyEgress {
			break
		}
		set := 0
		for _, b := range []bool{e.CIDR != "", e.DNSName != "", e.Tenant != "", e.Any} {
			if b {
				set++
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("egress[%d]: exactly one of cidr, dns_name, tenant and any must be set", i)
		}
		ports, err := portMatches(e.Ports)
		if err != nil {
			return nil, fmt.Errorf("egress[%d]: %w", i, err)
		}
		switch {
		case e.Tenant != "":
			to := []match{toSub}
			switch e.Tenant {
			case runtime.TenantSameOrg:
			case runtime.TenantSameUser:
				to = append(to, match{kind: callerMember}) // mark: the source's caller (peer_egress)
			default:
				return nil, fmt.Errorf("egress[%d]: tenant %q is not supported by this backend", i, e.Tenant)
			}
			for _, pm := range ports {
				toPeers = append(toPeers, newRule("accept", to, pm))
			}
		case e.DNSName != "":
			if m.cfg.ProxyPort == 0 {
				return nil, fmt.Errorf("egress[%d]: dns_name needs the egress proxy (Config.ProxyPort)", i)
			}
			if err := egress.ValidPattern(e.DNSName); err != nil {
				return nil, fmt.Errorf("egress[%d]: %w", i, err)
			}
			mem.grants = append(mem.grants, e.DNSName)
			if e.Secret != nil {
				mem.inject = append(mem.inject, e.DNSName)
			}
		default:
			dst, err := m.egressMatch(e.Any, e.CIDR, e.Except)
			if err != nil {
				return nil, fmt.Errorf("egress[%d]: %w", i, err)
			}
			if dst == nil {
				continue // IPv6 (sandboxes have none) or wholly reserved: nothing to allow
			}
			for _, pm := range ports {
				out = append(out, newRule("accept", dst, pm))
			}
			if covers443(e.Ports) {
				keep443 = append(keep443, newRule("return", dst))
			}
		}
	}
	mem.egress = append(mem.egress, toPeers...)
	mem.egress = append(mem.egress, newRule("drop", []match{toSub}))
	mem.egress = append(mem.egress, out...)
	mem.egress = append(mem.egress, rule{verdict: "drop"})
	if len(mem.grants) > 0 {
		// TCP 443 a CIDR/any rule allows goes out directly; the rest is the proxy's, which
		// checks the server name against the grants and dials the name itself.
		mem.dnat = append(mem.dnat, newRule("return", []match{toSub}), newRule("return", []match{{kind: localDst}}))
		mem.dnat = append(mem.dnat, keep443...)
		to := rule{match: []match{{kind: dports, proto: "tcp", ports: []portRange{{443, 443}}}},
			dnat: netip.AddrPortFrom(m.gateway, uint16(m.cfg.ProxyPort))} // New checked the port
		mem.dnat = append(mem.dnat, to)
	}

	// Ingress: only CUSTOM ports, and only what a rule opens.
	for i, in := range n.Ingress {
		if n.DenyIngress || len(r.Custom) == 0 {
			break
		}
		set := 0
		for _, b := range []bool{in.CIDR != "", in.Tenant != "", in.Any} {
			if b {
				set++
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("ingress[%d]: exactly one of cidr, tenant and any must be set", i)
		}
		if _, err := portMatches(in.Ports); err != nil {
			return nil, fmt.Errorf("ingress[%d]: %w", i, err)
		}
		open := intersect(r.Custom, in.Ports)
		if in.Tenant != "" {
			switch in.Tenant {
			case runtime.TenantSameOrg:
				mem.peer = append(mem.peer, open...)
			case runtime.TenantSameUser:
				mem.peerU = append(mem.peerU, open...)
			default:
				return nil, fmt.Errorf("ingress[%d]: tenant %q is not supported by this backend", i, in.Tenant)
			}
			continue
		}
		src, err := addrMatch(true, in.Any, in.CIDR, in.Except, reserved.Set{})
		if err != nil {
			return nil, fmt.Errorf("ingress[%d]: %w", i, err)
		}
		if src == nil || len(open) == 0 {
			continue
		}
		for _, pm := range portSetMatches(open) {
			mem.ingress = append(mem.ingress, newRule("accept", src, pm))
		}
	}
	mem.peer, mem.peerU = dedupPorts(mem.peer), dedupPorts(mem.peerU)
	return mem, nil
}

// memberScript writes the nft commands that take a sandbox from old to new (either nil).
func (m *Manager) memberScript(b *strings.Builder, old, new *member) {
	t := m.cfg.Table
	// Elements: old ones out, new ones in.
	elements := func(verb string, x *member) {
		for _, k := range []struct {
			mark         uint32
			ofMap, ports string
			peer         []Port
		}{{x.mark, "org_of", "peer", x.peer}, {x.cmark, "caller_of", "peer_user", x.peerU}} {
			if k.mark == 0 {
				continue
			}
			if verb == "add" {
				fmt.Fprintf(b, "add element inet %s %s { %s : 0x%x }\n", t, k.ofMap, x.ip, k.mark)
			} else {
				fmt.Fprintf(b, "delete element inet %s %s { %s }\n", t, k.ofMap, x.ip)
			}
			for _, p := range k.peer {
				fmt.Fprintf(b, "%s element inet %s %s { %s . %s . %d . 0x%x }\n", verb, t, k.ports, x.ip, p.Proto, p.Port, k.mark)
			}
		}
		if x.cmark != 0 {
			fmt.Fprintf(b, "%s element inet %s caller_member { %s . 0x%x }\n", verb, t, x.ip, x.cmark)
		}
	}
	if old != nil {
		elements("delete", old)
	}
	if new != nil {
		elements("add", new)
	}
	hex := ipHex(first(old, new).ip)
	for _, c := range chainsOf(old, new) {
		chain := c.prefix + hex
		switch {
		case c.has == nil:
			fmt.Fprintf(b, "delete element inet %s %s { %s }\n", t, c.vmap, old.ip)
			fmt.Fprintf(b, "delete chain inet %s %s\n", t, chain)
			continue
		case c.had != nil:
			fmt.Fprintf(b, "flush chain inet %s %s\n", t, chain)
		default:
			fmt.Fprintf(b, "add chain inet %s %s\n", t, chain)
		}
		for _, r := range c.has {
			fmt.Fprintf(b, "add rule inet %s %s %s\n", t, chain, r)
		}
		if c.had == nil {
			fmt.Fprintf(b, "add element inet %s %s { %s : jump %s }\n", t, c.vmap, new.ip, chain)
		}
	}
}

// chainChange is one of a sandbox's chains before and after (nil: none).
type chainChange struct {
	prefix, vmap string
	had, has     []rule
}

// chainsOf is the chains of old and new (either nil) that either has.
func chainsOf(old, new *member) []chainChange {
	var out []chainChange
	for _, c := range []struct {
		prefix, vmap string
		rules        func(*member) []rule
	}{
		{"e", "egress_of", func(x *member) []rule { return x.egress }},
		{"i", "ingress_of", func(x *member) []rule { return x.ingress }},
		{"n", "dnat_of", func(x *member) []rule { return x.dnat }},
	} {
		cc := chainChange{prefix: c.prefix, vmap: c.vmap}
		if old != nil {
			cc.had = c.rules(old)
		}
		if new != nil {
			cc.has = c.rules(new)
		}
		if cc.had != nil || cc.has != nil {
			out = append(out, cc)
		}
	}
	return out
}

func first(a, b *member) *member {
	if a != nil {
		return a
	}
	return b
}

func ipHex(ip netip.Addr) string {
	b := ip.As4()
	return fmt.Sprintf("%02x%02x%02x%02x", b[0], b[1], b[2], b[3])
}

// reservedElements is the set "reserved" that "any" excludes: every reserved range
// (reserved.V4, whatever the operator opened) and the sandbox subnet, merged (an
// interval set refuses overlaps). The host's own addresses never reach the forward
// chain (the input chain drops them).
func (m *Manager) reservedElements() string {
	return joinPrefixes(reserved.NewSet(reserved.V4()...).Add(m.cfg.Subnet).Prefixes())
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// ReservedEgress is what no cidr egress rule reaches on this network: the reserved
// ranges the operator did not open (Config.OpenReserved), the sandbox subnet and the
// host's own addresses now. The runner refuses rules wholly inside it.
func (m *Manager) ReservedEgress() reserved.Set {
	var host []netip.Prefix
	for _, a := range reserved.HostAddrs() {
		host = append(host, netip.PrefixFrom(a, a.BitLen()))
	}
	return m.cut.Add(host...)
}

// egressMatch is the match of an egress rule's destination: "any" (the internet: not
// @reserved), or a CIDR with its exceptions and, cut out of it, what m.cut holds of it.
// nil when nothing is left to allow (an IPv6 prefix, or a wholly reserved one).
func (m *Manager) egressMatch(anyAddr bool, cidr string, except []string) ([]match, error) {
	return addrMatch(false, anyAddr, cidr, except, m.cut)
}

// addrMatch is the match of "any" (not @reserved) or of a CIDR without its exceptions
// and what cut holds of it, on the source (saddr) or destination address; nil for an
// IPv6 prefix, which no sandbox traffic can match, or when nothing of the prefix is left.
func addrMatch(saddr, anyAddr bool, cidr string, except []string, cut reserved.Set) ([]match, error) {
	if anyAddr {
		return []match{{kind: notReserved, saddr: saddr}}, nil
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("cidr %q: %w", cidr, err)
	}
	if !p.Addr().Is4() {
		return nil, nil
	}
	p = p.Masked()
	ex := reserved.NewSet(cut.Overlap(p)...)
	for _, e := range except {
		q, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("except %q: %w", e, err)
		}
		if q.Addr().Is4() && q.Overlaps(p) {
			ex = ex.Add(q)
		}
	}
	if ex.Covers(p) {
		return nil, nil
	}
	var ms []match
	if p.Bits() > 0 {
		ms = append(ms, match{kind: addrIn, saddr: saddr, prefixes: []netip.Prefix{p}})
	}
	// The exceptions that reach 255.255.255.255 (with those adjacent to them) are matches
	// of their own: in a set nft writes them as an interval open at the top, marked in
	// element userdata that the netlink library (nftnl.go) cannot write.
	exs := ex.Overlap(p)
	i := len(exs)
	if i > 1 {
		if _, last := span(exs[i-1]); last == 1<<32-1 {
			for i--; i > 0 && touch(exs[i-1], exs[i]); i-- {
			}
		}
	}
	if i > 0 {
		ms = append(ms, match{kind: addrNotIn, saddr: saddr, prefixes: exs[:i]})
	}
	for _, q := range exs[i:] {
		ms = append(ms, match{kind: addrNotIn, saddr: saddr, prefixes: []netip.Prefix{q}})
	}
	if len(ms) == 0 {
		ms = append(ms, match{kind: nfprotoV4})
	}
	return ms, nil
}

// portMatches turns port ranges into matches, one per protocol; [nil] (match all) for
// none.
func portMatches(ports []runtime.PortRange) ([][]match, error) {
	if len(ports) == 0 {
		return [][]match{nil}, nil
	}
	byProto := map[string][]portRange{}
	for _, p := range ports {
		proto := strings.ToLower(p.Protocol)
		if proto == "" {
			proto = "tcp"
		}
		if proto != "tcp" && proto != "udp" && proto != "sctp" {
			return nil, fmt.Errorf("protocol %q (want tcp, udp or sctp)", p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 || p.EndPort != 0 && (p.EndPort < p.Port || p.EndPort > 65535) {
			return nil, fmt.Errorf("port range %d-%d", p.Port, p.EndPort)
		}
		byProto[proto] = append(byProto[proto], portRange{uint16(p.Port), uint16(max(p.Port, p.EndPort))})
	}
	return protoMatches(byProto), nil
}

func portSetMatches(ports []Port) [][]match {
	byProto := map[string][]portRange{}
	for _, p := range ports {
		byProto[p.Proto] = append(byProto[p.Proto], portRange{p.Port, p.Port})
	}
	return protoMatches(byProto)
}

// protoMatches is a match per protocol of its ports, and one of its own for a range to
// 65535 beside other ports (a set would make it an interval open at the top: addrMatch).
func protoMatches(byProto map[string][]portRange) [][]match {
	var out [][]match
	for _, proto := range sortedKeys(byProto) {
		ps := mergeRanges(byProto[proto])
		if n := len(ps); n > 1 && ps[n-1].hi == 65535 {
			out = append(out, []match{{kind: dports, proto: proto, ports: ps[:n-1]}})
			ps = ps[n-1:]
		}
		out = append(out, []match{{kind: dports, proto: proto, ports: ps}})
	}
	return out
}

// span is the first and last address of an IPv4 prefix, as numbers.
func span(p netip.Prefix) (first, last uint64) {
	a := p.Masked().Addr().As4()
	first = uint64(binary.BigEndian.Uint32(a[:]))
	return first, first | (1<<(32-p.Bits()) - 1)
}

// touch reports whether prefix b starts right after a.
func touch(a, b netip.Prefix) bool {
	_, last := span(a)
	first, _ := span(b)
	return last+1 == first
}

// covers443 reports whether a rule with these ports allows TCP 443.
func covers443(ports []runtime.PortRange) bool {
	return len(ports) == 0 || len(intersect([]Port{{"tcp", 443}}, ports)) > 0
}

// intersect returns the ports of ps a rule with ranges rs allows (all for no ranges).
func intersect(ps []Port, rs []runtime.PortRange) []Port {
	if len(rs) == 0 {
		return append([]Port(nil), ps...)
	}
	var out []Port
	for _, p := range ps {
		for _, r := range rs {
			proto, end := strings.ToLower(r.Protocol), r.EndPort
			if proto == "" {
				proto = "tcp"
			}
			if end < r.Port {
				end = r.Port
			}
			if proto == p.Proto && int(p.Port) >= r.Port && int(p.Port) <= end {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func dedupPorts(ps []Port) []Port {
	seen := map[Port]bool{}
	var out []Port
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
