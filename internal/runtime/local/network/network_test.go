//go:build linux

package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const blockedTimeout = 400 * time.Millisecond

func TestSetupReachableFromHost(t *testing.T) {
	m := newTestManager(t, false)
	a := setup(t, m, "reach-"+randHex(4))

	if !m.Subnet().Contains(a.IP) || a.IP == a.Gateway || a.Gateway != m.Gateway() || a.PrefixLen != 24 {
		t.Fatalf("bad attachment %+v (subnet %s)", a, m.Subnet())
	}
	if len(a.HostVeth) > 15 || !strings.HasPrefix(a.HostVeth, "sbx") {
		t.Fatalf("host veth name %q", a.HostVeth)
	}

	// Inside: lo and eth0 up, the address, the default route via the gateway.
	nsh, err := netns.GetFromPath(a.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	nh, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("%s is not up", name)
		}
	}
	eth, _ := nh.LinkByName("eth0")
	addrs, err := nh.AddrList(eth, unix.AF_INET)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != a.IP.String() {
		t.Fatalf("eth0 addresses %v, %v; want %s", addrs, err, a.IP)
	}
	if eth.Attrs().HardwareAddr.String() != a.MAC {
		t.Errorf("eth0 MAC %s, want %s", eth.Attrs().HardwareAddr, a.MAC)
	}
	routes, err := nh.RouteList(eth, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	hasDefault := false
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == a.Gateway.String() {
			hasDefault = true
		}
	}
	if !hasDefault {
		t.Errorf("no default route via %s: %v", a.Gateway, routes)
	}

	// Host side: on the bridge and isolated.
	hl, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if hl.Attrs().MasterIndex != m.brIdx {
		t.Errorf("host veth master %d, want bridge %d", hl.Attrs().MasterIndex, m.brIdx)
	}
	if pi, err := netlink.LinkGetProtinfo(hl); err != nil || !pi.Isolated {
		t.Errorf("bridge port not isolated: %+v %v", pi, err)
	}
	// Operationally up already (no linkwatch lag): checked with a dump, which
	// does not itself sync the link state.
	all, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all {
		if n := l.Attrs().Name; (n == a.HostVeth || n == m.cfg.Bridge) && l.Attrs().OperState != netlink.OperUp {
			t.Errorf("%s operstate %v right after Setup", n, l.Attrs().OperState)
		}
	}

	// A server inside the sandbox is reachable at IP:port from the host with the host mark
	// (as the edge dials; TestHostGuard has the rest).
	serve(t, a.NetNSPath, ":8080", "sandbox")
	line, err := dialMarked(m, netip.AddrPortFrom(a.IP, 8080).String(), 2*time.Second)
	if err != nil {
		t.Fatalf("host -> sandbox: %v", err)
	}
	if want := "sandbox " + a.Gateway.String() + ":"; !strings.HasPrefix(line, want) {
		t.Errorf("got %q, want prefix %q", line, want)
	}
	// Its own loopback works too.
	serve(t, a.NetNSPath, "127.0.0.1:9000", "lo")
	if line, err := dial(a.NetNSPath, "127.0.0.1:9000", time.Second); err != nil || !strings.HasPrefix(line, "lo ") {
		t.Errorf("sandbox loopback: %q %v", line, err)
	}
}

func TestSandboxesIsolatedFromEachOther(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "iso-a-"+randHex(4))
	b := setup(t, m, "iso-b-"+randHex(4))
	serve(t, a.NetNSPath, ":8080", "A")
	serve(t, b.NetNSPath, ":8080", "B")

	brnf, _ := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	cases := []struct {
		name             string
		isolated, rules  bool
		reachable        bool
		needsBrNetfilter bool
	}{
		{name: "isolated ports and rules", isolated: true, rules: true},
		// The bridge answers ARP for every sandbox (private ports between sandboxes of an
		// organization are routed through the host), so without the rules the host would
		// route between them: the forward chain is what stops it.
		{name: "isolated ports only: routed by the host", isolated: true, rules: false, reachable: true},
		// Bridged frames see the nft forward chain only with br_netfilter.
		{name: "rules only", isolated: false, rules: true, needsBrNetfilter: true},
		{name: "neither: control", isolated: false, rules: false, reachable: true},
		{name: "restored", isolated: true, rules: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.needsBrNetfilter && strings.TrimSpace(string(brnf)) != "1" {
				t.Skip("br_netfilter with bridge-nf-call-iptables=1 not active")
			}
			for _, s := range []*Attachment{a, b} {
				l, err := netlink.LinkByName(s.HostVeth)
				if err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkSetIsolated(l, c.isolated); err != nil {
					t.Fatal(err)
				}
			}
			if c.rules {
				if err := applyRules(m.table()); err != nil {
					t.Fatal(err)
				}
			} else if err := deleteTable(m.cfg.Table); err != nil {
				t.Fatal(err)
			}
			// The host, with its mark, reaches both.
			for _, s := range []*Attachment{a, b} {
				if _, err := dialMarked(m, netip.AddrPortFrom(s.IP, 8080).String(), 2*time.Second); err != nil {
					t.Fatalf("host -> %s: %v", s.ID, err)
				}
			}
			// Neither reaches the other (except in the control case).
			for _, d := range []struct{ from, to *Attachment }{{a, b}, {b, a}} {
				timeout := blockedTimeout
				if c.reachable {
					timeout = 2 * time.Second
				}
				line, err := dial(d.from.NetNSPath, netip.AddrPortFrom(d.to.IP, 8080).String(), timeout)
				if !c.reachable && err == nil {
					t.Errorf("%s reached %s: %q", d.from.ID, d.to.ID, line)
				}
				if c.reachable && err != nil {
					t.Errorf("control: %s -> %s: %v", d.from.ID, d.to.ID, err)
				}
			}
		})
	}
}

func TestSandboxCannotReachHost(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "host-"+randHex(4))

	// A second host address, on a dummy interface: "the host's own addresses"
	// means all of them, not only the gateway.
	other := netip.AddrFrom4([4]byte{198, 19, randByte(), 1})
	// (No dummy driver on this kernel; a port-less bridge works the same.)
	dummy := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "sbxtd" + randHex(3), Flags: net.FlagUp, TxQLen: -1}}
	noteLink(dummy.Name)
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(dummy) })
	if err := netlink.AddrAdd(dummy, &netlink.Addr{IPNet: &net.IPNet{IP: other.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}

	gwLn := serve(t, "", netip.AddrPortFrom(m.Gateway(), 0).String(), "gw").(*net.TCPAddr)
	anyLn := serve(t, "", "0.0.0.0:0", "any").(*net.TCPAddr)
	targets := []string{
		netip.AddrPortFrom(m.Gateway(), uint16(gwLn.Port)).String(),
		netip.AddrPortFrom(m.Gateway(), uint16(anyLn.Port)).String(),
		netip.AddrPortFrom(other, uint16(anyLn.Port)).String(),
	}

	cases := []struct {
		name      string
		rules     bool
		reachable bool
	}{
		{"rules on: blocked", true, false},
		// Control: without the table the same dials succeed, so the block
		// above is the input rule and not a routing accident.
		{"rules off: control", false, true},
		{"rules restored: blocked", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.rules {
				if err := applyRules(m.table()); err != nil {
					t.Fatal(err)
				}
			} else if err := deleteTable(m.cfg.Table); err != nil {
				t.Fatal(err)
			}
			for _, target := range targets {
				line, err := dial(a.NetNSPath, target, blockedTimeout)
				if c.reachable && err != nil {
					t.Errorf("sandbox -> %s: %v", target, err)
				}
				if !c.reachable && err == nil {
					t.Errorf("sandbox reached host service %s: %q", target, line)
				}
			}
			// The host still reaches its own services.
			if _, err := dial("", targets[0], time.Second); err != nil {
				t.Errorf("host -> %s: %v", targets[0], err)
			}
		})
	}
}

func TestEgressNAT(t *testing.T) {
	requireNetAdmin(t)
	inet := newInternet(t)
	srv := netip.AddrPortFrom(inet.addr, 80).String()
	serve(t, inet.nsPath, srv, "internet")
	// The host itself reaches "the internet" directly.
	if _, err := dial("", srv, time.Second); err != nil {
		t.Fatalf("host -> internet: %v", err)
	}

	for _, egress := range []bool{true, false} {
		t.Run(fmt.Sprintf("egress=%v", egress), func(t *testing.T) {
			m := newTestManager(t, egress)
			out, err := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
			if err != nil {
				t.Fatalf("nft list: %v %s", err, out)
			}
			if got := strings.Contains(string(out), "masquerade"); got != egress {
				t.Errorf("masquerade rule present=%v, want %v:\n%s", got, egress, out)
			}
			a := setup(t, m, "egress-"+randHex(4))
			line, err := dial(a.NetNSPath, srv, blockedTimeout*2)
			if !egress {
				if err == nil {
					t.Fatalf("egress disabled but reached the internet: %q", line)
				}
				return
			}
			if err != nil {
				t.Fatalf("sandbox -> internet: %v", err)
			}
			// The server sees the host's address on its link, not the sandbox's.
			if want := "internet " + inet.hostAddr.String() + ":"; !strings.HasPrefix(line, want) {
				t.Errorf("server saw %q, want source %s (masqueraded)", line, inet.hostAddr)
			}
		})
	}
}

func TestTeardownLeavesNothing(t *testing.T) {
	m := newTestManager(t, true)
	// Other test binaries create and delete links on this host at the same time, so
	// count only this manager's bridge ports.
	ports := func() int {
		br, err := netlink.LinkByName(m.cfg.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				n++
			}
		}
		return n
	}
	before := ports()
	id := "td-" + randHex(4)
	noteLink(vethName(m.cfg.Bridge, id))
	a, err := m.Setup(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !isNSFS(a.NetNSPath) {
		t.Fatal("netns mount missing after Setup")
	}
	ipFile := filepath.Join(m.ipsDir, a.IP.String())
	if b, err := os.ReadFile(ipFile); err != nil || string(b) != id {
		t.Fatalf("ip file: %q %v", b, err)
	}
	for i := range 2 { // idempotent
		if err := m.Teardown(id); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
	}
	if after := ports(); after != before {
		t.Errorf("bridge ports: %d before, %d after", before, after)
	}
	if _, err := netlink.LinkByName(a.HostVeth); err == nil {
		t.Errorf("host veth %s still exists", a.HostVeth)
	}
	if isNSFS(a.NetNSPath) {
		t.Errorf("netns %s still mounted", a.NetNSPath)
	}
	for _, p := range []string{a.NetNSPath, ipFile, m.recordPath(id)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", p, err)
		}
	}
	if _, err := m.Lookup(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup after Teardown: %v, want ErrNotFound", err)
	}
}

func TestSetupFailuresLeaveNothing(t *testing.T) {
	m := newTestManager(t, false)
	countIPs := func() int {
		ents, _ := os.ReadDir(m.ipsDir)
		n := 0
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				n++
			}
		}
		return n
	}
	cases := []struct {
		name    string
		id      string
		prepare func(t *testing.T, id string)
		ctx     func() context.Context
		wantErr error
	}{
		{name: "invalid id", id: "../x"},
		{name: "canceled context", id: "cx-" + randHex(4), ctx: func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, wantErr: context.Canceled},
		{name: "host veth name taken", id: "vt-" + randHex(4), prepare: func(t *testing.T, id string) {
			d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: vethName(m.cfg.Bridge, id), TxQLen: -1}}
			noteLink(d.Name)
			if err := netlink.LinkAdd(d); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = netlink.LinkDel(d) })
		}, wantErr: ErrExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.prepare != nil {
				c.prepare(t, c.id)
			}
			ctx := context.Background()
			if c.ctx != nil {
				ctx = c.ctx()
			}
			_, err := m.Setup(ctx, c.id)
			if err == nil {
				t.Fatal("Setup succeeded")
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("error %v, want %v", err, c.wantErr)
			}
			if n := countIPs(); n != 0 {
				t.Errorf("%d addresses still allocated", n)
			}
			if ents, _ := os.ReadDir(m.netnsDir); len(ents) != 0 {
				t.Errorf("netns files left: %v", ents)
			}
			if held, _ := m.holder.list(); len(held) != 0 {
				t.Errorf("netns mount left: %v", held)
			}
		})
	}

	// A second Setup of a live id fails with ErrExists and leaves the first intact.
	a := setup(t, m, "dup-"+randHex(4))
	if _, err := m.Setup(context.Background(), a.ID); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate Setup: %v, want ErrExists", err)
	}
	if got, err := m.Lookup(a.ID); err != nil || *got != *a {
		t.Fatalf("Lookup after duplicate Setup: %+v %v", got, err)
	}
}

func TestConcurrentSetupAndLookupAfterRestart(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, true)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cur := m // the Manager in charge; replaced on "restart"
	t.Cleanup(func() {
		if err := cur.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		cur.Close()
	})
	const n = 20
	atts := make([]*Attachment, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		id := fmt.Sprintf("conc-%02d-%s", i, randHex(3))
		noteLink(vethName(m.cfg.Bridge, id))
		wg.Go(func() { atts[i], errs[i] = m.Setup(context.Background(), id) })
	}
	wg.Wait()
	seenIP := map[netip.Addr]string{}
	seenVeth := map[string]bool{}
	for i, a := range atts {
		if errs[i] != nil {
			t.Fatalf("Setup %d: %v", i, errs[i])
		}
		if prev, dup := seenIP[a.IP]; dup {
			t.Errorf("%s and %s share %s", prev, a.ID, a.IP)
		}
		seenIP[a.IP] = a.ID
		seenVeth[a.HostVeth] = true
		if !m.Subnet().Contains(a.IP) || a.IP == m.Gateway() {
			t.Errorf("bad IP %s", a.IP)
		}
	}
	if len(seenIP) != n || len(seenVeth) != n {
		t.Fatalf("%d distinct IPs, %d distinct veths, want %d", len(seenIP), len(seenVeth), n)
	}

	// "Runner restart": a new Manager on the same state dir (the old one is
	// closed, its host setup and sandboxes stay) finds the same attachments.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	cur = m
	ids, err := m.List()
	if err != nil || len(ids) != n {
		t.Fatalf("List: %d ids, %v", len(ids), err)
	}
	for _, a := range atts {
		got, err := m.Lookup(a.ID)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", a.ID, err)
		}
		if *got != *a {
			t.Errorf("Lookup(%s) = %+v, want %+v", a.ID, got, a)
		}
	}
	// A new sandbox after the restart gets an address nobody has.
	b := setup(t, m, "after-"+randHex(4))
	if prev, dup := seenIP[b.IP]; dup {
		t.Errorf("new sandbox got %s, still used by %s", b.IP, prev)
	}
	// And the old ones are still reachable from the host.
	serve(t, atts[7].NetNSPath, ":8080", "seven")
	if _, err := dialMarked(m, netip.AddrPortFrom(atts[7].IP, 8080).String(), 2*time.Second); err != nil {
		t.Errorf("host -> sandbox after restart: %v", err)
	}

	for _, a := range atts {
		wg.Go(func() {
			if err := m.Teardown(a.ID); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ents, _ := os.ReadDir(m.ipsDir); len(ents) != 1 {
		t.Errorf("after teardown of %d: %d ip files, want 1", n, len(ents))
	}
}

func TestNewIsIdempotent(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "idem-"+randHex(4))
	for range 2 {
		m2, err := New(m.cfg)
		if err != nil {
			t.Fatal(err)
		}
		m2.Close()
	}
	addrs, err := netlink.AddrList(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.cfg.Bridge}}, unix.AF_INET)
	if err != nil || len(addrs) != 1 {
		t.Fatalf("bridge addresses after repeated New: %v %v", addrs, err)
	}
	out, _ := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
	if c := strings.Count(string(out), "masquerade"); c != 1 {
		t.Errorf("%d masquerade rules after repeated New:\n%s", c, out)
	}
	if _, err := dialMarked(m, netip.AddrPortFrom(a.IP, 1).String(), time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("sandbox not reachable after repeated New (want connection refused): %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"no state dir", Config{}},
		{"long bridge name", Config{StateDir: t.TempDir(), Bridge: "abcdefghijklmnop"}},
		{"ipv6 subnet", Config{StateDir: t.TempDir(), Subnet: netip.MustParsePrefix("fd00::/64")}},
		{"tiny subnet", Config{StateDir: t.TempDir(), Subnet: netip.MustParsePrefix("10.1.2.0/31")}},
		{"bad table", Config{StateDir: t.TempDir(), Table: "x; flush ruleset"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if m, err := New(c.cfg); err == nil {
				m.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}

func TestNames(t *testing.T) {
	a, b := vethName("sbx0", "x"), vethName("sbx1", "x")
	if a == b || len(a) != 13 || vethName("sbx0", "x") != a {
		t.Errorf("vethName: %q %q", a, b)
	}
	for _, id := range []string{"", ".", "..", ".hidden", "a/b", "a b", strings.Repeat("x", 129)} {
		if validID(id) == nil {
			t.Errorf("validID(%q) accepted", id)
		}
	}
	if err := validID("sbx_01H-abc.def"); err != nil {
		t.Error(err)
	}
	if got := lastAddr(netip.MustParsePrefix("10.88.0.0/16")); got.String() != "10.88.255.255" {
		t.Errorf("lastAddr = %s", got)
	}
	if got := macForIP(netip.MustParseAddr("10.88.1.2")).String(); got != "02:5b:0a:58:01:02" {
		t.Errorf("macForIP = %s", got)
	}
}

func BenchmarkSetupTeardown(b *testing.B) {
	m := newTestManager(b, true)
	var setupTotal, teardownTotal time.Duration
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
		if err := m.Teardown(id); err != nil {
			b.Fatal(err)
		}
		setupTotal += t1.Sub(t0)
		teardownTotal += time.Since(t1)
	}
	b.ReportMetric(float64(setupTotal.Microseconds())/float64(i), "setup-µs/op")
	b.ReportMetric(float64(teardownTotal.Microseconds())/float64(i), "teardown-µs/op")
}

// TestReach: a sandbox reaches the private ports of another sandbox of its organization,
// and nothing else of it; sandboxes of another organization reach none of them.
func TestReach(t *testing.T) {
	m := newTestManager(t, true)
	server := setup(t, m, "reach-s-"+randHex(4))
	peer := setup(t, m, "reach-p-"+randHex(4))
	other := setup(t, m, "reach-o-"+randHex(4))
	serve(t, server.NetNSPath, ":8080", "private")
	serve(t, server.NetNSPath, ":9090", "undeclared")
	if err := m.SetRules(server.ID, Rules{Org: "org-a", Private: []Port{{"tcp", 8080}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetRules(peer.ID, Rules{Org: "org-a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetRules(other.ID, Rules{Org: "org-b"}); err != nil {
		t.Fatal(err)
	}
	try := func(from *Attachment, port uint16) error {
		_, err := dial(from.NetNSPath, netip.AddrPortFrom(server.IP, port).String(), blockedTimeout)
		return err
	}
	if err := try(peer, 8080); err != nil {
		out, _ := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
		neigh, _ := exec.Command("nsenter", "--net="+peer.NetNSPath, "ip", "neigh").CombinedOutput()
		sys, _ := exec.Command("bash", "-c", "grep . /proc/sys/net/ipv4/conf/"+m.cfg.Bridge+"/{proxy_arp,proxy_arp_pvlan,forwarding,rp_filter}").CombinedOutput()
		t.Errorf("same organization, private port: %v\n%s\n%s\n%s", err, out, neigh, sys)
	}
	if err := try(peer, 9090); err == nil {
		t.Error("same organization reached an undeclared port")
	}
	if err := try(other, 8080); err == nil {
		t.Error("another organization reached the private port")
	}
	// The server made private nothing of the peer: the way back is closed.
	serve(t, peer.NetNSPath, ":8080", "peer")
	if _, err := dial(server.NetNSPath, netip.AddrPortFrom(peer.IP, 8080).String(), blockedTimeout); err == nil {
		t.Error("reached a port the peer never declared")
	}
	// Withdrawn (a new declaration replaces the old), then gone with the sandbox.
	if err := m.SetRules(server.ID, Rules{Org: "org-a"}); err != nil {
		t.Fatal(err)
	}
	if err := try(peer, 8080); err == nil {
		t.Error("reached a port no longer private")
	}
	if err := m.SetRules(server.ID, Rules{Org: "org-a", Private: []Port{{"tcp", 8080}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(server.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(m.pol.members); n != 2 {
		t.Errorf("%d members after a teardown, want 2", n)
	}
	if err := m.SetRules("no-such-sandbox", Rules{Org: "org-a"}); err == nil {
		t.Error("rules for a sandbox without a network accepted")
	}
}

// TestHostSideScales: what the host keeps per sandbox does not make the next sandbox's
// start cost more. The host veth has no IPv6 (no link-local address, no routes in the
// host's IPv6 table, which the kernel walked whole at every host veth's carrier change),
// and the bridge does no multicast snooping (which re-armed every port's timers at every
// port's carrier change). (TestSetupReachableFromHost: IPv4 works as before.)
func TestHostSideScales(t *testing.T) {
	m := newTestManager(t, false)
	a := setup(t, m, "scale-"+randHex(4))
	if _, err := os.Stat("/proc/sys/net/ipv6/conf"); err == nil {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + a.HostVeth + "/disable_ipv6")
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Errorf("%s: disable_ipv6 = %q, %v; want 1", a.HostVeth, b, err)
		}
		hl, err := netlink.LinkByName(a.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		if addrs, err := netlink.AddrList(hl, unix.AF_INET6); err != nil || len(addrs) != 0 {
			t.Errorf("%s: IPv6 addresses %v, %v; want none", a.HostVeth, addrs, err)
		}
		if routes, err := netlink.RouteList(hl, unix.AF_INET6); err != nil || len(routes) != 0 {
			t.Errorf("%s: IPv6 routes %v, %v; want none", a.HostVeth, routes, err)
		}
	}
	b, err := os.ReadFile("/sys/class/net/" + m.cfg.Bridge + "/bridge/multicast_snooping")
	if err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("bridge %s: multicast_snooping = %q, %v; want 0", m.cfg.Bridge, b, err)
	}
}

// TestSetupReplacesStaleHostVeth: a host veth by the name Setup derives for an id that has
// no attachment (an earlier life of the id left it: a runner killed between its steps,
// or the kernel still destroying a dropped namespace's pair) does not fail the id's
// Setup, which deletes it and makes its own; a veth by that name pinned for another
// sandbox is refused.
func TestSetupReplacesStaleHostVeth(t *testing.T) {
	m := newTestManager(t, false)
	id := "stale-" + randHex(4)
	name := vethName(m.cfg.Bridge, id)
	noteLink(name)
	stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: -1, MasterIndex: m.brIdx},
		PeerName: "sbxstp" + randHex(3), PeerTxQLen: -1}
	if err := netlink.LinkAdd(stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(stale) })
	old, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	a := setup(t, m, id)
	now, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if now.Attrs().Index == old.Attrs().Index {
		t.Fatalf("Setup kept the stale link %d", old.Attrs().Index)
	}
	if now.Attrs().MasterIndex != m.brIdx {
		t.Errorf("new veth on master %d, want the bridge %d", now.Attrs().MasterIndex, m.brIdx)
	}

	// The same name pinned for another sandbox is not this id's to delete.
	other := "pinned-" + randHex(4)
	name2 := vethName(m.cfg.Bridge, other)
	noteLink(name2)
	v2 := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name2, TxQLen: -1}, PeerName: "sbxstq" + randHex(3), PeerTxQLen: -1}
	if err := netlink.LinkAdd(v2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(v2) })
	m.pinMu.Lock()
	m.pins["someone-else"] = pin{veth: name2}
	m.pinMu.Unlock()
	t.Cleanup(func() { m.pinMu.Lock(); delete(m.pins, "someone-else"); m.pinMu.Unlock() })
	if _, err := m.Setup(context.Background(), other); !errors.Is(err, ErrExists) {
		t.Fatalf("Setup over a veth pinned for another sandbox: %v, want ErrExists", err)
	}
	if _, err := netlink.LinkByName(name2); err != nil {
		t.Errorf("the other sandbox's veth was deleted: %v", err)
	}
}
