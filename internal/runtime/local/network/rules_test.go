//go:build linux

package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// world is a network namespace standing for everything outside the host: public
// addresses (TEST-NET 203.0.113.x, 198.51.100.x) and private ones (10.x, 172.16.x,
// 192.168.x, link-local), all on one veth. Only the test Manager's subnet is routed to
// it (a policy-routing rule and table of its own), so the host's own routes, including
// its cloud-metadata route, are untouched and concurrent tests cannot collide.
type world struct {
	nsPath   string
	hostAddr netip.Addr // host side of the link (the masquerade source)
	addr     netip.Addr // the world side of the link
	dst      map[string]netip.Addr
}

// world destinations by name.
const (
	pub     = "public"
	pub2    = "public2"
	priv10  = "10/8"
	priv172 = "172.16/12"
	priv192 = "192.168/16"
	llocal  = "link-local"
)

func newWorld(t testing.TB, m *Manager) *world {
	t.Helper()
	x, y := randByte(), randByte()
	w := &world{
		nsPath:   t.TempDir() + "/world",
		hostAddr: netip.AddrFrom4([4]byte{198, 18, x, 1}),
		addr:     netip.AddrFrom4([4]byte{198, 18, x, 2}),
		dst: map[string]netip.Addr{
			pub:     netip.AddrFrom4([4]byte{203, 0, 113, y}),
			pub2:    netip.AddrFrom4([4]byte{198, 51, 100, y}),
			priv10:  netip.AddrFrom4([4]byte{10, 199, x, y}),
			priv172: netip.AddrFrom4([4]byte{172, 16, x, y}),
			priv192: netip.AddrFrom4([4]byte{192, 168, x, y}),
			llocal:  netip.MustParseAddr("169.254.169.254"),
		},
	}
	addrs := []netip.Prefix{netip.PrefixFrom(w.addr, 24)}
	for _, a := range values(w.dst) {
		addrs = append(addrs, netip.PrefixFrom(a, 32))
	}
	name := linkedNS(t, w.nsPath, w.hostAddr, addrs, func(nh *netlink.Handle, eth netlink.Link) {
		// Back to the host (and the sandboxes, for ingress) through the link.
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: w.hostAddr.AsSlice()}); err != nil {
			t.Fatal(err)
		}
	})

	// The sandboxes' traffic (source in the subnet) routes by a table of its own: the
	// subnet on the bridge, everything else into the world.
	table := 20000 + int(x)<<8 + int(y)
	hl, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	routes := []*netlink.Route{
		{LinkIndex: m.brIdx, Dst: prefixNet(m.Subnet()), Table: table, Scope: netlink.SCOPE_LINK},
		{LinkIndex: hl.Attrs().Index, Gw: w.addr.AsSlice(), Table: table},
	}
	for _, r := range routes {
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("route %v: %v", r, err)
		}
	}
	rule := netlink.NewRule()
	rule.Src = prefixNet(m.Subnet())
	rule.Table = table
	rule.Priority = 100
	if err := netlink.RuleAdd(rule); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netlink.RuleDel(rule); err != nil {
			t.Error(err)
		}
		_ = netlink.RouteDel(routes[0]) // the other went with the veth
	})

	// Servers: TCP 80, 443, 8080 and 9999 answer "<local address> <remote address>"; UDP
	// 5353 echoes.
	for _, port := range []int{80, 443, 8080, 9999} {
		serveAddr(t, w.nsPath, fmt.Sprintf("0.0.0.0:%d", port))
	}
	// One UDP socket per address: a reply must come from the address asked.
	for _, a := range values(w.dst) {
		var pc net.PacketConn
		if err := inNetNS(w.nsPath, func() (err error) { pc, err = net.ListenPacket("udp4", a.String()+":5353"); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go echoUDP(pc)
	}
	return w
}

func echoUDP(pc net.PacketConn) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

func values(m map[string]netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// serveAddr is serve with the server's local address as its name: a reply tells which
// destination answered.
func serveAddr(t testing.TB, path, addr string) {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) { ln, err = net.Listen("tcp4", addr); return err }
	var err error
	if path == "" {
		err = listen()
	} else {
		err = inNetNS(path, listen)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { _ = serveLines(ln) }()
}

// serveLines answers every connection with "<local address> <remote address>\n".
func serveLines(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr())
		c.Close()
	}
}

// Stand-ins for internal/egress's servers: they only show who called.
type echoDNS struct{}

func (echoDNS) ServeUDP(pc net.PacketConn) error { echoUDP(pc); return nil }
func (echoDNS) ServeTCP(l net.Listener) error    { return serveLines(l) }

type lineProxy struct{}

func (lineProxy) Serve(l net.Listener) error { return serveLines(l) }

// udpExchange sends payload from the namespace at path and returns the reply.
func udpExchange(path, addr string, payload []byte, timeout time.Duration) ([]byte, error) {
	var reply []byte
	err := inNetNS(path, func() error {
		c, err := net.DialTimeout("udp4", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write(payload); err != nil {
			return err
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		reply = buf[:n]
		return err
	})
	return reply, err
}

// probe is one connection attempt from a sandbox.
type probe struct {
	dst   string // world destination name
	port  int
	proto string // "tcp" (default) or "udp"
}

func (p probe) String() string {
	if p.proto == "" {
		return fmt.Sprintf("%s:%d", p.dst, p.port)
	}
	return fmt.Sprintf("%s:%d/%s", p.dst, p.port, p.proto)
}

// try reports whether the probe from the sandbox got an answer from the destination.
func (w *world) try(from *Attachment, p probe) error {
	addr := netip.AddrPortFrom(w.dst[p.dst], uint16(p.port)).String()
	if p.proto == "udp" {
		got, err := udpExchange(from.NetNSPath, addr, []byte("ping"), blockedTimeout)
		if err == nil && string(got) != "ping" {
			err = fmt.Errorf("echo %q", got)
		}
		return err
	}
	line, err := dial(from.NetNSPath, addr, blockedTimeout)
	if err == nil && !strings.HasPrefix(line, addr+" ") {
		err = fmt.Errorf("answered by %q, want %s", line, addr)
	}
	return err
}

// expect runs every probe at once (blocked ones wait out the timeout) and checks that
// exactly those in allow get through.
func (w *world) expect(t *testing.T, from *Attachment, probes []probe, allow map[probe]bool) {
	t.Helper()
	errs := make([]error, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Go(func() { errs[i] = w.try(from, p) })
	}
	wg.Wait()
	for i, p := range probes {
		switch {
		case allow[p] && errs[i] != nil:
			t.Errorf("%s: blocked (%v), want allowed", p, errs[i])
		case !allow[p] && errs[i] == nil:
			t.Errorf("%s: allowed, want blocked", p)
		}
	}
}

func cidr32(a netip.Addr) string { return netip.PrefixFrom(a, 32).String() }

// TestEgressRules: each sandbox reaches exactly what its egress rules allow.
func TestEgressRules(t *testing.T) {
	m := newTestManager(t, true)
	w := newWorld(t, m)
	all := []probe{
		{dst: pub, port: 80}, {dst: pub, port: 8080}, {dst: pub2, port: 80}, {dst: pub, port: 5353, proto: "udp"},
		{dst: priv10, port: 80}, {dst: priv172, port: 80}, {dst: priv192, port: 80}, {dst: llocal, port: 80},
	}
	allowed := func(ps ...probe) map[probe]bool {
		out := map[probe]bool{}
		for _, p := range ps {
			out[p] = true
		}
		return out
	}
	every := allowed(all...)
	cases := []struct {
		name  string
		net   *runtime.Network
		allow map[probe]bool
	}{
		// Specs recorded before rules existed: as before, everything outside the host.
		{"nil network: old behaviour", nil, every},
		{"no rules: nothing", &runtime.Network{}, nil},
		{"deny egress", &runtime.Network{DenyEgress: true, Egress: []runtime.EgressRule{{Any: true}}}, nil},
		{"any: the internet only", &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}},
			allowed(all[:4]...)},
		{"default egress", &runtime.Network{Egress: runtime.DefaultEgress()}, allowed(all[:4]...)},
		{"cidr", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "198.51.100.0/24"}}},
			allowed(probe{dst: pub2, port: 80})},
		// An explicit CIDR never reaches the reserved ranges (they are cut out of it);
		// except carves out of it too.
		{"cidr with except", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "0.0.0.0/0", Except: []string{cidr32(w.dst[pub]), "192.168.0.0/16"}}}},
			allowed(probe{dst: pub2, port: 80})},
		{"0.0.0.0/0: the internet only", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "0.0.0.0/0"}}}, allowed(all[:4]...)},
		{"reserved cidrs are no grant", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "169.254.169.254/32"}, {CIDR: "192.168.0.0/16"},
			{CIDR: "10.0.0.0/8"}, {CIDR: "172.16.0.0/12"}, {CIDR: "127.0.0.0/8"}, {CIDR: m.Subnet().String()}}}, nil},
		{"ipv6 cidr is no grant", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "::/0"}}}, nil},
		{"any on one tcp port", &runtime.Network{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Port: 8080}}}}},
			allowed(probe{dst: pub, port: 8080})},
		{"port range and udp", &runtime.Network{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Protocol: "tcp", Port: 70, EndPort: 90}, {Protocol: "udp", Port: 5353}}}}},
			allowed(probe{dst: pub, port: 80}, probe{dst: pub2, port: 80}, probe{dst: pub, port: 5353, proto: "udp"})},
		{"rules add up", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: cidr32(w.dst[pub2]), Ports: []runtime.PortRange{{Port: 80}}}, {CIDR: cidr32(w.dst[pub]), Ports: []runtime.PortRange{{Protocol: "udp", Port: 5353}}}}},
			allowed(probe{dst: pub2, port: 80}, probe{dst: pub, port: 5353, proto: "udp"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := setup(t, m, "eg-"+randHex(4))
			if err := m.SetRules(a.ID, Rules{Org: "org", Network: c.net}); err != nil {
				t.Fatal(err)
			}
			w.expect(t, a, all, c.allow)
		})
	}

	// Rules change in place: the same sandbox, narrowed and widened again.
	a := setup(t, m, "eg-change-"+randHex(4))
	for _, c := range []struct {
		net   *runtime.Network
		allow map[probe]bool
	}{
		{&runtime.Network{DenyEgress: true}, nil},
		{&runtime.Network{Egress: []runtime.EgressRule{{CIDR: cidr32(w.dst[pub])}}}, allowed(all[0], all[1], all[3])},
		{nil, every},
	} {
		if err := m.SetRules(a.ID, Rules{Network: c.net}); err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprintf("changed to %+v", c.net), func(t *testing.T) { w.expect(t, a, all, c.allow) })
	}
}

// TestEgressOpenReserved: a reserved range the operator opens (Config.OpenReserved) is
// reachable by an explicit cidr rule, and by nothing else: "any" still excludes it, and
// the other reserved ranges stay cut out of a wider rule.
func TestEgressOpenReserved(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, true)
	cfg.OpenReserved = []netip.Prefix{netip.MustParsePrefix("10.199.0.0/16")}
	m := newManagerFrom(t, cfg)
	w := newWorld(t, m) // priv10 is 10.199.x.y
	all := []probe{{dst: pub, port: 80}, {dst: priv10, port: 80}, {dst: priv172, port: 80}, {dst: llocal, port: 80}}
	for _, c := range []struct {
		name  string
		net   *runtime.Network
		allow []probe
	}{
		{"opened cidr", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "10.199.0.0/16"}}}, []probe{all[1]}},
		{"wider cidr: the opened part only", &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "0.0.0.0/0"}}}, []probe{all[0], all[1]}},
		{"any does not include it", &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}, []probe{all[0]}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := setup(t, m, "op-"+randHex(4))
			if err := m.SetRules(a.ID, Rules{Network: c.net}); err != nil {
				t.Fatal(err)
			}
			allow := map[probe]bool{}
			for _, p := range c.allow {
				allow[p] = true
			}
			w.expect(t, a, all, allow)
		})
	}
	if rs := m.ReservedEgress(); rs.Covers(netip.MustParsePrefix("10.199.0.0/16")) || !rs.Covers(netip.MustParsePrefix("10.198.0.0/16")) ||
		!rs.Covers(m.Subnet()) || !rs.Contains(w.hostAddr) {
		t.Errorf("ReservedEgress = %v", rs.Prefixes())
	}
}

// TestEgressScriptCutsReserved checks the chain an explicit cidr compiles to: the
// reserved parts of the prefix (merged with the rule's exceptions) are excluded, a
// wholly reserved prefix allows nothing, and "any" uses the reserved set.
func TestEgressScriptCutsReserved(t *testing.T) {
	sub := netip.MustParsePrefix("10.88.0.0/16")
	m := &Manager{cfg: Config{Subnet: sub, Table: "t"}, cut: reserved.Egress([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, sub)}
	m.pol.orgs, m.pol.callers = map[string]uint32{}, map[string]uint32{}
	ip := netip.MustParseAddr("10.88.0.9")
	for _, c := range []struct {
		rule runtime.EgressRule
		want []string // the chain's accept rules
	}{
		{runtime.EgressRule{CIDR: "169.254.169.254/32"}, nil},
		{runtime.EgressRule{CIDR: "192.168.0.0/16"}, nil},
		{runtime.EgressRule{CIDR: "10.0.0.0/8"}, []string{"ip daddr 10.0.0.0/8 ip daddr != { 10.0.0.0/12, 10.16.0.0/14, 10.21.0.0/16, 10.22.0.0/15, 10.24.0.0/13, 10.32.0.0/11, 10.64.0.0/10, 10.128.0.0/9 } accept"}},
		{runtime.EgressRule{CIDR: "10.20.0.0/16"}, []string{"ip daddr 10.20.0.0/16 accept"}},
		{runtime.EgressRule{CIDR: "192.0.0.0/8", Except: []string{"192.168.7.0/24", "192.0.2.0/24"}}, []string{"ip daddr 192.0.0.0/8 ip daddr != { 192.0.2.0/24, 192.168.0.0/16 } accept"}},
		{runtime.EgressRule{CIDR: "203.0.113.0/24"}, []string{"ip daddr 203.0.113.0/24 accept"}},
		{runtime.EgressRule{Any: true}, []string{"ip daddr != @reserved accept"}},
		// Exceptions reaching 255.255.255.255 are matches of their own (not in a set).
		{runtime.EgressRule{CIDR: "192.0.0.0/2", Except: []string{"223.0.0.0/8", "198.18.0.0/15"}},
			[]string{"ip daddr 192.0.0.0/2 ip daddr != { 192.168.0.0/16, 198.18.0.0/15 } ip daddr != { 223.0.0.0/8 } ip daddr != { 224.0.0.0/3 } accept"}},
		{runtime.EgressRule{Any: true, Ports: []runtime.PortRange{{Port: 1024, EndPort: 65535}, {Port: 80}, {Port: 81}, {Protocol: "udp", Port: 53}}},
			[]string{"ip daddr != @reserved meta l4proto tcp th dport { 80-81 } accept", "ip daddr != @reserved meta l4proto tcp th dport { 1024-65535 } accept",
				"ip daddr != @reserved meta l4proto udp th dport { 53 } accept"}},
	} {
		mem, err := m.compile(ip, Rules{Network: &runtime.Network{Egress: []runtime.EgressRule{c.rule}}})
		if err != nil {
			t.Fatalf("%+v: %v", c.rule, err)
		}
		want := append(append([]string{"ip daddr 10.88.0.0/16 drop"}, c.want...), "drop")
		if fmt.Sprint(mem.egress) != fmt.Sprint(want) {
			t.Errorf("%+v:\n got %q\nwant %q", c.rule, mem.egress, want)
		}
	}
	got := m.reservedElements()
	if want := "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16, 224.0.0.0/3"; got != want {
		t.Errorf("reserved set = %s, want %s", got, want)
	}
}

func TestRulesRejected(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "bad-"+randHex(4))
	for _, n := range []runtime.Network{
		{Egress: []runtime.EgressRule{{}}},
		{Egress: []runtime.EgressRule{{Any: true, CIDR: "1.2.3.0/24"}}},
		{Egress: []runtime.EgressRule{{CIDR: "1.2.3.0/33"}}},
		{Egress: []runtime.EgressRule{{CIDR: "1.2.3.0/24", Except: []string{"x"}}}},
		{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSandboxNetwork}}},
		{Egress: []runtime.EgressRule{{Tenant: "everyone"}}},
		{Egress: []runtime.EgressRule{{DNSName: "example.com"}}}, // no proxy configured
		{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Protocol: "icmp", Port: 1}}}}},
		{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Port: 0}}}}},
		{Egress: []runtime.EgressRule{{Any: true, Ports: []runtime.PortRange{{Port: 90, EndPort: 80}}}}},
		{Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSandboxNetwork}}},
		{Ingress: []runtime.IngressRule{{Any: true, Tenant: runtime.TenantSameOrg}}},
	} {
		if err := m.SetRules(a.ID, Rules{Custom: []Port{{"tcp", 80}}, Network: &n}); err == nil {
			t.Errorf("accepted %+v", n)
		}
	}
	// Nothing was applied: still the old behaviour, and no rules file.
	if _, err := os.Stat(m.rulesPath(a.ID)); !os.IsNotExist(err) {
		t.Errorf("rules file after refusals: %v", err)
	}
}

// TestPeerRules: sandbox to sandbox needs both sides: the source's egress (same_org) and
// the destination's ingress (its PRIVATE ports, or CUSTOM ports a same_org ingress rule
// opens), within one organization.
func TestPeerRules(t *testing.T) {
	m := newTestManager(t, true)
	sameOrg := []runtime.EgressRule{{Tenant: runtime.TenantSameOrg}}
	server := setup(t, m, "peer-srv-"+randHex(4))
	if err := m.SetRules(server.ID, Rules{Org: "a", Private: []Port{{"tcp", 8080}}, Custom: []Port{{"tcp", 9090}, {"tcp", 9091}},
		Network: &runtime.Network{Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSameOrg, Ports: []runtime.PortRange{{Port: 9090}}}}}}); err != nil {
		t.Fatal(err)
	}
	mine := setup(t, m, "peer-mine-"+randHex(4)) // CUSTOM 9090 for its caller only
	if err := m.SetRules(mine.ID, Rules{Org: "a", Caller: "key-1", Custom: []Port{{"tcp", 9090}},
		Network: &runtime.Network{Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSameUser}}}}); err != nil {
		t.Fatal(err)
	}
	closed := setup(t, m, "peer-closed-"+randHex(4))
	if err := m.SetRules(closed.ID, Rules{Org: "a", Private: []Port{{"tcp", 8080}}, Custom: []Port{{"tcp", 9090}},
		Network: &runtime.Network{DenyIngress: true, Ingress: []runtime.IngressRule{{Tenant: runtime.TenantSameOrg}}}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Attachment{server, closed, mine} {
		for _, port := range []string{":8080", ":9090", ":9091", ":7070"} {
			serveAddr(t, s.NetNSPath, "0.0.0.0"+port)
		}
	}
	type dst struct {
		to   *Attachment
		port int
	}
	probes := []dst{{server, 8080}, {server, 9090}, {server, 9091}, {server, 7070}, {closed, 8080}, {closed, 9090}, {mine, 9090}}
	cases := []struct {
		name  string
		rules Rules
		allow []dst
	}{
		{"same org, same_org egress", Rules{Org: "a", Network: &runtime.Network{Egress: sameOrg}},
			[]dst{{server, 8080}, {server, 9090}, {closed, 8080}}},
		{"same caller, same_org egress", Rules{Org: "a", Caller: "key-1", Network: &runtime.Network{Egress: sameOrg}},
			[]dst{{server, 8080}, {server, 9090}, {closed, 8080}, {mine, 9090}}},
		{"same caller, same_user egress", Rules{Org: "a", Caller: "key-1", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameUser}}}},
			[]dst{{mine, 9090}}},
		{"other caller, same_org egress", Rules{Org: "a", Caller: "key-2", Network: &runtime.Network{Egress: sameOrg}},
			[]dst{{server, 8080}, {server, 9090}, {closed, 8080}}},
		{"other caller, same_user egress", Rules{Org: "a", Caller: "key-2", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameUser}}}}, nil},
		{"same org, same_org on one port", Rules{Org: "a", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameOrg, Ports: []runtime.PortRange{{Port: 9090}}}}}},
			[]dst{{server, 9090}}},
		{"same org, any but not same_org", Rules{Org: "a", Network: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}, {CIDR: m.Subnet().String()}}}}, nil},
		{"same org, deny egress", Rules{Org: "a", Network: &runtime.Network{DenyEgress: true}}, nil},
		{"same org, no rules (old behaviour)", Rules{Org: "a"}, []dst{{server, 8080}, {server, 9090}, {closed, 8080}}},
		{"other org", Rules{Org: "b", Network: &runtime.Network{Egress: sameOrg}}, nil},
		{"no org", Rules{Network: &runtime.Network{Egress: sameOrg}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from := setup(t, m, "peer-"+randHex(4))
			if err := m.SetRules(from.ID, c.rules); err != nil {
				t.Fatal(err)
			}
			errs := make([]error, len(probes))
			var wg sync.WaitGroup
			for i, p := range probes {
				wg.Go(func() {
					_, errs[i] = dial(from.NetNSPath, netip.AddrPortFrom(p.to.IP, uint16(p.port)).String(), blockedTimeout)
				})
			}
			wg.Wait()
			for i, p := range probes {
				want := false
				for _, a := range c.allow {
					want = want || a == p
				}
				name := fmt.Sprintf("%s:%d", strings.SplitN(p.to.ID, "-", 3)[1], p.port)
				if want && errs[i] != nil {
					t.Errorf("%s blocked: %v", name, errs[i])
				}
				if !want && errs[i] == nil {
					t.Errorf("%s reached", name)
				}
			}
		})
	}
}

// TestCustomIngressFromOutside: CUSTOM ports open to the sources the ingress rules name,
// coming from outside the host; PRIVATE and undeclared ports stay closed to them.
func TestCustomIngressFromOutside(t *testing.T) {
	m := newTestManager(t, true)
	w := newWorld(t, m)
	link := netip.PrefixFrom(w.addr, 24).Masked().String()
	cases := []struct {
		name    string
		ingress []runtime.IngressRule
		deny    bool
		allow   []int
	}{
		{"cidr", []runtime.IngressRule{{CIDR: link}}, false, []int{9090, 9091}},
		{"cidr, upper-case protocol", []runtime.IngressRule{{CIDR: link, Ports: []runtime.PortRange{{Protocol: "TCP", Port: 9090}}}}, false, []int{9090}},
		{"cidr on one port", []runtime.IngressRule{{CIDR: link, Ports: []runtime.PortRange{{Port: 9091}}}}, false, []int{9091}},
		{"cidr except the client", []runtime.IngressRule{{CIDR: link, Except: []string{cidr32(w.addr)}}}, false, nil},
		{"another cidr", []runtime.IngressRule{{CIDR: "203.0.113.0/24"}}, false, nil},
		{"any", []runtime.IngressRule{{Any: true}}, false, []int{9090, 9091}},
		{"same org only", []runtime.IngressRule{{Tenant: runtime.TenantSameOrg}}, false, nil},
		{"deny ingress", []runtime.IngressRule{{Any: true}}, true, nil},
		{"none", nil, false, nil},
	}
	ports := []int{8080, 9090, 9091, 7070}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := setup(t, m, "in-"+randHex(4))
			for _, p := range ports {
				serveAddr(t, s.NetNSPath, fmt.Sprintf("0.0.0.0:%d", p))
			}
			if err := m.SetRules(s.ID, Rules{Org: "a", Private: []Port{{"tcp", 8080}}, Custom: []Port{{"tcp", 9090}, {"tcp", 9091}},
				Network: &runtime.Network{DenyIngress: c.deny, Ingress: c.ingress}}); err != nil {
				t.Fatal(err)
			}
			for _, p := range ports {
				want := false
				for _, a := range c.allow {
					want = want || a == p
				}
				line, err := dial(w.nsPath, netip.AddrPortFrom(s.IP, uint16(p)).String(), blockedTimeout)
				if want && err != nil {
					t.Errorf("port %d blocked: %v", p, err)
				}
				if !want && err == nil {
					t.Errorf("port %d reached: %q", p, line)
				}
				if want && err == nil && !strings.HasSuffix(line, " "+w.addr.String()+":"+strings.Split(line, ":")[len(strings.Split(line, ":"))-1]) {
					t.Errorf("port %d: server saw %q, want the client's own address %s", p, line, w.addr)
				}
			}
		})
	}
}

// TestPlatformDNSAndProxy: every sandbox reaches the gateway's port 53 (UDP and TCP) and
// nothing else of the host; dns_name grants send TCP 443 that no CIDR/any rule allows to
// the proxy port on the gateway. Stand-in servers play DNS and proxy here (they only
// report who called); internal/egress's are tested on the local backend.
func TestPlatformDNSAndProxy(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, true)
	cfg.ProxyPort = 20000 + int(randByte())<<4
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Cleanup(); err != nil {
			t.Error(err)
		}
		m.Close()
	})
	w := newWorld(t, m)
	gw := m.Gateway().String()
	if ns := m.Nameservers(); len(ns) != 1 || ns[0] != gw {
		t.Errorf("resolv.conf nameservers %v, want the gateway %s", ns, gw)
	}
	if err := m.StartServices(echoDNS{}, lineProxy{}); err != nil {
		t.Fatal(err)
	}
	if err := m.StartServices(echoDNS{}, nil); err == nil {
		t.Error("services started twice")
	}
	serveAddr(t, "", gw+":54") // a port nobody may use

	grants := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "*.example.com"}, {DNSName: "example.org"}, {CIDR: cidr32(w.dst[pub])}}}
	proxy := fmt.Sprintf("%s:%d", gw, cfg.ProxyPort)
	cases := []struct {
		name string
		net  *runtime.Network
		// what answers TCP 443 of pub and pub2: the world, the proxy or nobody ("")
		pub443, pub2443 string
	}{
		{"deny egress", &runtime.Network{DenyEgress: true}, "", ""},
		{"nil network", nil, "world", "world"},
		{"dns_name grants and a cidr", grants, "world", "proxy"},
		{"dns_name grant, cidr on another port", &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "example.com"}, {CIDR: cidr32(w.dst[pub]), Ports: []runtime.PortRange{{Port: 80}}}}}, "proxy", "proxy"},
		{"any", &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}, "world", "world"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := setup(t, m, "dns-"+randHex(4))
			if err := m.SetRules(a.ID, Rules{Network: c.net}); err != nil {
				t.Fatal(err)
			}
			if got, err := udpExchange(a.NetNSPath, gw+":53", []byte("query"), time.Second); err != nil || string(got) != "query" {
				t.Errorf("DNS over UDP: %q %v", got, err)
			}
			if line, err := dial(a.NetNSPath, gw+":53", time.Second); err != nil || !strings.HasPrefix(line, gw+":53 "+a.IP.String()+":") {
				t.Errorf("DNS over TCP: %q %v", line, err)
			}
			if line, err := dial(a.NetNSPath, gw+":54", blockedTimeout); err == nil {
				t.Errorf("reached another gateway port: %q", line)
			}
			for _, p := range []struct {
				dst, want string
			}{{pub, c.pub443}, {pub2, c.pub2443}} {
				addr := netip.AddrPortFrom(w.dst[p.dst], 443).String()
				line, err := dial(a.NetNSPath, addr, blockedTimeout)
				var got string
				switch {
				case err != nil:
				case strings.HasPrefix(line, addr+" "):
					got = "world"
				case strings.HasPrefix(line, proxy+" "+a.IP.String()+":"): // the proxy sees the sandbox
					got = "proxy"
				default:
					got = line
				}
				if got != p.want {
					t.Errorf("%s:443 answered by %q (%v), want %q", p.dst, got, err, p.want)
				}
			}
			wantGrants := []string(nil)
			if c.net != nil {
				for _, e := range c.net.Egress {
					if e.DNSName != "" {
						wantGrants = append(wantGrants, e.DNSName)
					}
				}
			}
			if got := m.Grants(a.IP); fmt.Sprint(got) != fmt.Sprint(wantGrants) {
				t.Errorf("Grants = %v, want %v", got, wantGrants)
			}
		})
	}
}

// TestRulesSurviveRestart: a new Manager on the same state dir (a restarted runner)
// rebuilds the table with every sandbox's rules before anyone declares them again, and
// Teardown afterwards removes them all.
func TestRulesSurviveRestart(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, true)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cur := m
	t.Cleanup(func() {
		if err := cur.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		cur.Close()
	})
	w := newWorld(t, m)
	// Torn down below by whichever Manager is in charge (cur.Cleanup on failure).
	mk := func(id string) *Attachment {
		noteLink(vethName(cfg.Bridge, id))
		a, err := m.Setup(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	anyOnly, peer, server, legacy := mk("rs-any-"+randHex(4)), mk("rs-peer-"+randHex(4)), mk("rs-srv-"+randHex(4)), mk("rs-old-"+randHex(4))
	serveAddr(t, server.NetNSPath, "0.0.0.0:8080")
	for id, r := range map[string]Rules{
		anyOnly.ID: {Org: "x", Network: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}},
		peer.ID:    {Org: "y", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameOrg}}}},
		server.ID:  {Org: "y", Private: []Port{{"tcp", 8080}}, Network: &runtime.Network{}},
	} {
		if err := m.SetRules(id, r); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T) {
		w.expect(t, anyOnly, []probe{{dst: pub, port: 80}, {dst: priv10, port: 80}}, map[probe]bool{{dst: pub, port: 80}: true})
		w.expect(t, legacy, []probe{{dst: priv10, port: 80}}, map[probe]bool{{dst: priv10, port: 80}: true})
		if _, err := dial(peer.NetNSPath, netip.AddrPortFrom(server.IP, 8080).String(), time.Second); err != nil {
			t.Errorf("peer -> server: %v", err)
		}
		if _, err := dial(anyOnly.NetNSPath, netip.AddrPortFrom(server.IP, 8080).String(), blockedTimeout); err == nil {
			t.Error("another organization reached the server")
		}
	}
	t.Run("before", check)
	before, _ := exec.Command("nft", "list", "table", "inet", cfg.Table).CombinedOutput()

	m.Close()
	if m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	cur = m
	t.Run("after restart", check)
	after, _ := exec.Command("nft", "list", "table", "inet", cfg.Table).CombinedOutput()
	for _, chain := range []string{"e" + ipHex(anyOnly.IP), "e" + ipHex(peer.IP), "e" + ipHex(server.IP)} {
		if !strings.Contains(string(after), "chain "+chain+" {") {
			t.Errorf("chain %s missing after restart:\n%s", chain, after)
		}
	}
	if strings.Count(string(before), "accept") != strings.Count(string(after), "accept") {
		t.Errorf("table differs after restart:\n%s\n---\n%s", before, after)
	}

	// Teardown leaves no element, chain or rules file of any of them.
	for _, a := range []*Attachment{anyOnly, peer, server, legacy} {
		if err := m.Teardown(a.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(m.rulesPath(a.ID)); !os.IsNotExist(err) {
			t.Errorf("rules file of %s: %v", a.ID, err)
		}
	}
	out, _ := exec.Command("nft", "list", "table", "inet", cfg.Table).CombinedOutput()
	for _, a := range []*Attachment{anyOnly, peer, server, legacy} {
		if strings.Contains(string(out), a.IP.String()) || strings.Contains(string(out), ipHex(a.IP)) {
			t.Errorf("%s (%s) still in the table:\n%s", a.ID, a.IP, out)
		}
	}
	if n := len(m.pol.members); n != 0 {
		t.Errorf("%d members left", n)
	}
}

// BenchmarkSetupWithRules measures Setup+SetRules (the default egress and a private
// port) with n other sandboxes with rules present.
func BenchmarkSetupWithRules(b *testing.B) {
	for _, n := range []int{1, 200} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			m := newTestManager(b, true)
			rules := Rules{Org: "o", Private: []Port{{"tcp", 8080}}, Network: &runtime.Network{Egress: append(runtime.DefaultEgress(),
				runtime.EgressRule{CIDR: "203.0.113.0/24", Except: []string{"203.0.113.7/32"}, Ports: []runtime.PortRange{{Port: 443}}})}}
			for i := range n {
				id := fmt.Sprintf("bg-%d", i)
				a := setup(b, m, id)
				if err := m.SetRules(a.ID, rules); err != nil {
					b.Fatal(err)
				}
			}
			var setupT, rulesT, teardownT time.Duration
			i := 0
			for b.Loop() {
				id := fmt.Sprintf("bench-%d", i)
				i++
				noteLink(vethName(m.cfg.Bridge, id))
				t0 := time.Now()
				if _, err := m.Setup(context.Background(), id); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := m.SetRules(id, rules); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				if err := m.Teardown(id); err != nil {
					b.Fatal(err)
				}
				setupT += t1.Sub(t0)
				rulesT += t2.Sub(t1)
				teardownT += time.Since(t2)
			}
			b.ReportMetric(float64(setupT.Microseconds())/float64(i), "setup-µs/op")
			b.ReportMetric(float64(rulesT.Microseconds())/float64(i), "rules-µs/op")
			b.ReportMetric(float64(teardownT.Microseconds())/float64(i), "teardown-µs/op")
		})
	}
}

func TestForbidden(t *testing.T) {
	m := newTestManager(t, true)
	w := newWorld(t, m) // its link gives the host an address outside the reserved ranges
	a := setup(t, m, "fb-"+randHex(4))
	cases := []struct {
		addr      string
		forbidden bool
	}{
		{w.addr.String(), false},
		{w.dst[pub].String(), false},
		{"8.8.8.8", false},
		{w.hostAddr.String(), true}, // the host's own
		{m.Gateway().String(), true},
		{a.IP.String(), true},
		{"127.0.0.1", true},
		{"169.254.169.254", true},
		{"10.1.2.3", true},
		{"172.20.0.1", true},
		{"192.168.1.1", true},
		{"100.64.0.1", true},
		{"224.0.0.1", true},
		{"0.0.0.0", true},
		{"::1", true},
		{"2001:db8::1", true},
	}
	for _, c := range cases {
		if got := m.Forbidden(netip.MustParseAddr(c.addr)); got != c.forbidden {
			t.Errorf("Forbidden(%s) = %v, want %v", c.addr, got, c.forbidden)
		}
	}
}

// TestRulesRebuiltWhenTableChanged: when an incremental change cannot apply (here: the
// table was deleted behind the Manager's back), the Manager rebuilds the whole table
// from what it knows, so earlier sandboxes keep their rules.
func TestRulesRebuiltWhenTableChanged(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "heal-a-"+randHex(4))
	b := setup(t, m, "heal-b-"+randHex(4))
	deny := &runtime.Network{DenyEgress: true}
	if err := m.SetRules(a.ID, Rules{Org: "o", Private: []Port{{"tcp", 80}}, Network: deny}); err != nil {
		t.Fatal(err)
	}
	if err := deleteTable(m.cfg.Table); err != nil {
		t.Fatal(err)
	}
	if err := m.SetRules(b.ID, Rules{Org: "o", Network: deny}); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
	for _, want := range []string{"chain e" + ipHex(a.IP), "chain e" + ipHex(b.IP), a.IP.String() + " . tcp . 80"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("%q missing after the rebuild:\n%s", want, out)
		}
	}
}
