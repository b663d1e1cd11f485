//go:build linux

package network

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestElementsOverNetlink: rules without chains, or with an egress chain of the rules
// the API's defaults give, go over netlink (setElements, one transaction each), and the
// table then holds exactly what the nft script of the same members makes (sameAsScript:
// listed after each change, then after rebuilding the whole table with nft from the same
// members, the listings are equal). Changes replace (new organization, caller and ports:
// the old elements are gone) and Teardown removes them. TestRulesOverNetlink covers the
// other chains and rule forms.
func TestElementsOverNetlink(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "nl-a-"+randHex(4))
	b := setup(t, m, "nl-b-"+randHex(4))
	same := func(step string) string { t.Helper(); return sameAsScript(t, m, step) }
	steps := []struct {
		name string
		id   string
		r    Rules
		want []string // in the listing
		gone []string // not in it
	}{
		{"org, caller, ports", a.ID, Rules{Org: "o1", Caller: "k1", Private: []Port{{"tcp", 8080}, {"udp", 53}}, Custom: []Port{{"tcp", 9090}}},
			[]string{a.IP.String() + " : 0x00000001", a.IP.String() + " . tcp . 8080 . 0x00000001", a.IP.String() + " . udp . 53 . 0x00000001", a.IP.String() + " . 0x00000001"}, nil},
		{"second sandbox", b.ID, Rules{Org: "o2", Private: []Port{{"tcp", 80}}},
			[]string{b.IP.String() + " : 0x00000002", b.IP.String() + " . tcp . 80 . 0x00000002"}, nil},
		{"replaced", a.ID, Rules{Org: "o2", Caller: "k2", Private: []Port{{"tcp", 81}}},
			[]string{a.IP.String() + " : 0x00000002", a.IP.String() + " . tcp . 81 . 0x00000002", a.IP.String() + " . 0x00000002"},
			[]string{a.IP.String() + " . tcp . 8080", a.IP.String() + " . udp . 53", a.IP.String() + " : 0x00000001", a.IP.String() + " . 0x00000001"}},
		{"egress allows nothing", b.ID, Rules{Org: "o2", Network: &runtime.Network{}},
			[]string{"chain e" + ipHex(b.IP), b.IP.String() + " : jump e" + ipHex(b.IP), "ip daddr " + m.Subnet().String() + " drop"}, nil},
		{"deny egress, caller", b.ID, Rules{Org: "o2", Caller: "k1", Network: &runtime.Network{DenyEgress: true}},
			[]string{"chain e" + ipHex(b.IP), b.IP.String() + " : jump e" + ipHex(b.IP), b.IP.String() + " . 0x00000001"}, nil},
		{"same_org and any (a policy's defaults), replacing", b.ID, Rules{Org: "o2", Caller: "k1", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameOrg}, {Any: true}}}},
			[]string{"ip daddr " + m.Subnet().String() + " accept", "ip daddr != @reserved accept", b.IP.String() + " : jump e" + ipHex(b.IP)}, nil},
		{"no rules again", b.ID, Rules{Org: "o2"}, nil, []string{"chain e" + ipHex(b.IP), b.IP.String() + " : jump"}},
		{"chain again", a.ID, Rules{Org: "o2", Caller: "k2", Network: &runtime.Network{DenyEgress: true}},
			[]string{"chain e" + ipHex(a.IP), a.IP.String() + " : jump e" + ipHex(a.IP)}, nil},
	}
	for _, s := range steps {
		m.pol.mu.Lock()
		n := m.pol.batches
		m.pol.mu.Unlock()
		if err := m.SetRules(s.id, s.r); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		m.pol.mu.Lock()
		n = m.pol.batches - n
		m.pol.mu.Unlock()
		if n != 1 {
			t.Errorf("%s: %d netlink transactions, want 1", s.name, n)
		}
		got := same(s.name)
		for _, w := range s.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q missing:\n%s", s.name, w, got)
			}
		}
		for _, g := range s.gone {
			if strings.Contains(got, g) {
				t.Errorf("%s: %q still there:\n%s", s.name, g, got)
			}
		}
	}
	if err := m.Teardown(a.ID); err != nil { // with its chain
		t.Fatal(err)
	}
	if got := same("teardown"); strings.Contains(got, a.IP.String()) || strings.Contains(got, "chain e"+ipHex(a.IP)) {
		t.Errorf("%s still in the table after Teardown:\n%s", a.IP, got)
	}
}

// TestRulesOverNetlink: a change of a sandbox's own chains — egress rules with every
// destination, port and protocol form compile makes, dns_name grants (the dnat chain)
// and ingress rules (the ingress chain) — goes over netlink, one transaction and no nft
// process each, and the table then holds exactly what the nft script of the same
// members makes (sameAsScript: nft's listing and the kernel's expressions), also with
// ranges reaching the top of their type, which compile keeps out of sets.
func TestRulesOverNetlink(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, true)
	cfg.ProxyPort = DefaultProxyPort
	m := newManagerFrom(t, cfg)
	a := setup(t, m, "nr-a-"+randHex(4))
	b := setup(t, m, "nr-b-"+randHex(4))
	pr := func(proto string, port, end int) runtime.PortRange {
		return runtime.PortRange{Protocol: proto, Port: port, EndPort: end}
	}
	custom := []Port{{"tcp", 9000}, {"tcp", 9001}, {"udp", 9002}}
	every := &runtime.Network{
		Egress: []runtime.EgressRule{
			{Tenant: runtime.TenantSameOrg},
			{Tenant: runtime.TenantSameOrg, Ports: []runtime.PortRange{pr("", 80, 0)}},
			{Tenant: runtime.TenantSameUser, Ports: []runtime.PortRange{pr("udp", 53, 0), pr("tcp", 8000, 8080)}},
			{CIDR: "203.0.113.0/24"}, // whole bytes
			{CIDR: "198.51.100.7/32", Ports: []runtime.PortRange{pr("sctp", 9, 0)}}, // one address
			{CIDR: "203.0.112.0/22", Ports: []runtime.PortRange{pr("tcp", 443, 0)}}, // a mask
			{CIDR: "96.0.0.0/4"}, // one exception (100.64.0.0/10), a mask
			{CIDR: "8.0.0.0/5"},  // one exception (10.0.0.0/8), whole bytes
			{CIDR: "8.0.0.0/5", Except: []string{"11.0.0.0/8", "12.0.0.0/8", "8.8.8.8/32"}}, // a set, merged where adjacent
			{Any: true, Ports: []runtime.PortRange{pr("tcp", 1000, 2000)}},                  // one range
			{Any: true, Ports: []runtime.PortRange{pr("TCP", 22, 0), pr("tcp", 80, 0), pr("udp", 5000, 5010), pr("udp", 5011, 0), pr("udp", 7000, 7005), pr("udp", 7003, 0)}},
			{Any: true},
			{DNSName: "*.example.com"},
			{DNSName: "api.example.org"},
		},
		Ingress: []runtime.IngressRule{
			{CIDR: "192.0.2.0/24"},
			{CIDR: "0.0.0.0/0", Ports: []runtime.PortRange{pr("tcp", 9001, 0)}}, // any IPv4 source
			{Any: true, Ports: []runtime.PortRange{pr("tcp", 9000, 0), pr("udp", 9000, 9100)}},
			{CIDR: "198.18.0.0/15", Except: []string{"198.18.1.0/24", "198.19.0.0/16", "198.18.2.0/24"}},
			{CIDR: "198.51.100.0/24", Except: []string{"198.51.100.128/25"}},
			{Tenant: runtime.TenantSameOrg, Ports: []runtime.PortRange{pr("tcp", 9000, 0)}},
		},
	}
	open := &runtime.Network{ // ranges reaching the top: kept out of sets
		Egress: []runtime.EgressRule{
			{CIDR: "0.0.0.0/0"}, // 224.0.0.0/3 is reserved
			{CIDR: "192.0.0.0/2", Except: []string{"223.0.0.0/8"}},
			{Any: true, Ports: []runtime.PortRange{pr("tcp", 80, 0), pr("tcp", 1024, 65535)}},
		},
		Ingress: []runtime.IngressRule{{Any: true}},
	}
	custom = append(custom, Port{"udp", 65535}, Port{"udp", 65534})
	hexA, hexB := ipHex(a.IP), ipHex(b.IP)
	steps := []struct {
		name string
		id   string
		r    Rules
		nft  bool     // applied by nft (open intervals)
		want []string // in the listing
		gone []string // not in it
	}{
		{"every form", a.ID, Rules{Org: "o1", Caller: "k1", Custom: custom, Network: every}, false,
			[]string{"chain e" + hexA, "chain i" + hexA, "chain n" + hexA, "dnat ip to", "fib daddr type local return",
				"ip daddr 8.0.0.0/5 ip daddr != { 8.8.8.8, 10.0.0.0-12.255.255.255 } accept", "udp dport { 5000-5011, 7000-7005 }", "tcp dport { 22, 80 }",
				"ip saddr != { 198.18.1.0-198.18.2.255, 198.19.0.0/16 }", "meta nfproto ipv4 tcp dport 9001 accept"}, nil},
		{"second sandbox, the same", b.ID, Rules{Org: "o1", Caller: "k2", Custom: custom, Network: every}, false,
			[]string{"chain e" + hexB, "chain i" + hexB, "chain n" + hexB}, nil},
		{"replaced: egress only", a.ID, Rules{Org: "o1", Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "203.0.113.0/24", Ports: []runtime.PortRange{pr("udp", 123, 0)}}}}}, false,
			[]string{"chain e" + hexA, "ip daddr 203.0.113.0/24 udp dport 123 accept"}, []string{"chain i" + hexA, "chain n" + hexA}},
		{"ranges to the top", a.ID, Rules{Org: "o1", Custom: custom, Network: open}, false,
			[]string{"ip daddr != { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16 } ip daddr != 224.0.0.0/3 accept",
				"ip daddr 192.0.0.0/2 ip daddr != 192.168.0.0/16 ip daddr != 223.0.0.0/8 ip daddr != 224.0.0.0/3 accept",
				"tcp dport 80 accept", "tcp dport 1024-65535 accept", "ip saddr != @reserved udp dport 9002 accept", "ip saddr != @reserved udp dport 65534-65535 accept"}, nil},
		{"back", a.ID, Rules{Org: "o1", Custom: custom, Network: every}, false,
			[]string{"chain e" + hexA, "chain i" + hexA, "chain n" + hexA}, nil},
		{"only ingress and dnat change", a.ID, Rules{Org: "o1", Custom: custom[:1], Network: &runtime.Network{Egress: every.Egress[:13], Ingress: every.Ingress[2:3]}}, false,
			[]string{"chain i" + hexA + " {\n\t\tip saddr != @reserved tcp dport 9000 accept\n\t}", "chain n" + hexA}, nil},
		{"the same rules but a port", a.ID, Rules{Org: "o1", Custom: custom[:1], Network: &runtime.Network{Egress: every.Egress[:13], Ingress: every.Ingress[:1]}}, false,
			[]string{"chain i" + hexA}, nil},
		{"no chains", b.ID, Rules{Org: "o1"}, false, nil, []string{"chain e" + hexB, "chain i" + hexB, "chain n" + hexB, hexB}},
	}
	for _, s := range steps {
		m.pol.mu.Lock()
		n := m.pol.batches
		m.pol.mu.Unlock()
		runs := nftRuns.Load()
		if err := m.SetRules(s.id, s.r); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		m.pol.mu.Lock()
		n = m.pol.batches - n
		m.pol.mu.Unlock()
		runs = nftRuns.Load() - runs
		if s.nft && (runs != 1 || n != 0) {
			t.Errorf("%s: %d nft processes and %d netlink transactions, want 1 and none", s.name, runs, n)
		}
		if !s.nft && (runs != 0 || n != 1) {
			t.Errorf("%s: %d nft processes and %d netlink transactions, want none and 1", s.name, runs, n)
		}
		got := sameAsScript(t, m, s.name)
		for _, w := range s.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q missing:\n%s", s.name, w, got)
			}
		}
		for _, g := range s.gone {
			if strings.Contains(got, g) {
				t.Errorf("%s: %q still there:\n%s", s.name, g, got)
			}
		}
	}
	// The table changed behind the Manager's back (here: gone): the transaction fails
	// and the whole table is rebuilt by nft, with the change.
	if err := deleteTable(m.cfg.Table); err != nil {
		t.Fatal(err)
	}
	runs := nftRuns.Load()
	if err := m.SetRules(a.ID, Rules{Org: "o2", Custom: custom, Network: every}); err != nil {
		t.Fatal(err)
	}
	if d := nftRuns.Load() - runs; d != 1 {
		t.Errorf("rebuild: %d nft processes, want 1", d)
	}
	if got := sameAsScript(t, m, "rebuilt"); !strings.Contains(got, "chain n"+hexA) || !strings.Contains(got, a.IP.String()+" : 0x00000002") {
		t.Errorf("rebuilt table without the change:\n%s", got)
	}
	runs = nftRuns.Load()
	if err := m.Teardown(a.ID); err != nil { // with its chain
		t.Fatal(err)
	}
	if d := nftRuns.Load() - runs; d != 0 {
		t.Errorf("Teardown spawned %d nft processes, want none", d)
	}
	if got := sameAsScript(t, m, "teardown"); strings.Contains(got, a.IP.String()) || strings.Contains(got, hexA) {
		t.Errorf("%s still in the table after Teardown:\n%s", a.IP, got)
	}
}

// BenchmarkSetRules: one sandbox's rules set and cleared (a warm claim and its
// teardown), the API's default (an egress chain allowing nothing), a policy's default
// (same_org and any), elements only and an allow rule: through change (over netlink)
// and, the A/B, the same member's nft script (how change applied it before).
func BenchmarkSetRules(b *testing.B) {
	m := newTestManager(b, true)
	att := setup(b, m, "nl-bench-"+randHex(4))
	for _, c := range []struct {
		name string
		r    Rules
	}{
		{"api-default", Rules{Org: "o", Caller: "k", Network: &runtime.Network{}}},
		{"elements", Rules{Org: "o", Caller: "k"}},
		{"same-org-and-any", Rules{Org: "o", Caller: "k", Network: &runtime.Network{Egress: []runtime.EgressRule{{Tenant: runtime.TenantSameOrg}, {Any: true}}}}},
		{"allow-cidr", Rules{Org: "o", Caller: "k", Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "8.8.8.8/32"}}}}},
	} {
		b.Run(c.name+"/change", func(b *testing.B) {
			for b.Loop() {
				if err := m.SetRules(att.ID, c.r); err != nil {
					b.Fatal(err)
				}
				m.pol.mu.Lock()
				err := m.change(att.IP, nil)
				m.pol.mu.Unlock()
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/nft", func(b *testing.B) {
			m.pol.mu.Lock()
			defer m.pol.mu.Unlock()
			mem, err := m.compile(att.IP, c.r)
			if err != nil {
				b.Fatal(err)
			}
			var add, del strings.Builder
			m.memberScript(&add, nil, mem)
			m.memberScript(&del, mem, nil)
			for b.Loop() {
				if err := runNft(add.String()); err != nil {
					b.Fatal(err)
				}
				if err := runNft(del.String()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRuleChangeAt1000: one sandbox's egress rules replaced (two CIDR allow lists
// in turn, as bench/'s BenchmarkDensity changes them) with 1,000 sandboxes' rules in the
// table (organizations, callers, a private port and a policy's default egress chain
// each, a dns_name grant every tenth): SetRules over netlink (target ≤ 15 ms at 1,000),
// and the peer, the same change by an nft process (runNft of memberScript's script, how
// change applied it before), in the same run. It prints both p50 and p99.
func BenchmarkRuleChangeAt1000(b *testing.B) {
	requireNetAdmin(b)
	const n = 1000
	cfg := testConfig(b, true)
	cfg.Subnet = freeSubnet(b, 21)
	cfg.ProxyPort = DefaultProxyPort
	m := newManagerFrom(b, cfg)
	att := setup(b, m, "rc-"+randHex(4))
	// The others: members only (rules without links), put in with one rebuild.
	m.pol.mu.Lock()
	ip := att.IP
	for i := range n - 1 {
		ip = ip.Next()
		egress := runtime.DefaultEgress()
		if i%10 == 0 {
			egress = append(egress, runtime.EgressRule{DNSName: "*.example.com"})
		}
		mem, err := m.compile(ip, Rules{Org: fmt.Sprint("o", i%10), Caller: fmt.Sprint("k", i%50), Private: []Port{{"tcp", 8080}},
			Network: &runtime.Network{Egress: egress}})
		if err != nil {
			b.Fatal(err)
		}
		m.pol.set(ip, mem)
	}
	err := runNft(m.tableLocked())
	m.pol.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	rules := func(i int) Rules {
		cidr := []string{"203.0.113.0/24", "198.51.100.0/24"}[i%2]
		return Rules{Org: "o1", Caller: "k1", Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: cidr}}}}
	}
	report := func(b *testing.B, what string, lat []time.Duration) {
		slices.Sort(lat)
		at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
		b.ReportMetric(at(0.5), "p50-ms")
		b.ReportMetric(at(0.99), "p99-ms")
		fmt.Printf("rule change at %d sandboxes, %s: p50 %.2f ms p99 %.2f ms (%d changes)\n", n, what, at(0.5), at(0.99), len(lat))
	}
	b.Run("netlink", func(b *testing.B) {
		var lat []time.Duration
		runs := nftRuns.Load()
		for i := 0; b.Loop(); i++ {
			t0 := time.Now()
			if err := m.SetRules(att.ID, rules(i)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		if d := nftRuns.Load() - runs; d != 0 {
			b.Fatalf("%d nft processes", d)
		}
		report(b, "SetRules over netlink", lat)
	})
	b.Run("nft", func(b *testing.B) {
		m.pol.mu.Lock()
		defer m.pol.mu.Unlock()
		var lat []time.Duration
		for i := 0; b.Loop(); i++ {
			mem, err := m.compile(att.IP, rules(i))
			if err != nil {
				b.Fatal(err)
			}
			var sb strings.Builder
			t0 := time.Now()
			m.memberScript(&sb, m.pol.members[att.IP], mem)
			if err := runNft(sb.String()); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			m.pol.set(att.IP, mem)
		}
		report(b, "the same change by nft (the peer)", lat)
	})
}

// TestPinsOverNetlink: Setup pins a port and Teardown unpins it over netlink
// (pinsOverNetlink, one transaction each), and the bridge table then holds exactly what
// the nft script of the same pins makes: listed after each change, then after
// rebuilding the table with nft from the same pins, the two listings are equal. A
// sandbox's whole life on the plain path — Setup, the API's default rules, Teardown —
// spawns no nft process.
func TestPinsOverNetlink(t *testing.T) {
	m := newTestManager(t, true)
	list := func() string {
		t.Helper()
		out, err := exec.Command("nft", "-s", "list", "table", "bridge", m.cfg.Table).CombinedOutput() // -s: without counters, which the rebuild resets
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	same := func(step string) string {
		t.Helper()
		got := list()
		m.pinMu.Lock()
		err := m.rebuildPinsLocked()
		m.pinMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if want := list(); got != want {
			t.Fatalf("%s: over netlink:\n%s\nfrom the nft script:\n%s", step, got, want)
		}
		return got
	}
	batches := func() int {
		m.pinMu.Lock()
		defer m.pinMu.Unlock()
		return m.pinNl.batches
	}
	runs, n := nftRuns.Load(), batches()
	a := setup(t, m, "pn-a-"+randHex(4))
	if err := m.SetRules(a.ID, Rules{Org: "o1", Caller: "k1", Network: &runtime.Network{}}); err != nil {
		t.Fatal(err)
	}
	if d := nftRuns.Load() - runs; d != 0 {
		t.Errorf("Setup and SetRules (the API's default) spawned %d nft processes, want none", d)
	}
	if d := batches() - n; d != 1 {
		t.Errorf("Setup: %d netlink transactions on the bridge table, want 1", d)
	}
	got := same("setup a")
	for _, w := range []string{quote(a.HostVeth) + " . " + a.MAC + " . " + a.IP.String(), quote(a.HostVeth)} {
		if !strings.Contains(got, w) {
			t.Errorf("setup a: %q missing:\n%s", w, got)
		}
	}
	b := setup(t, m, "pn-b-"+randHex(4))
	same("setup b")
	runs, n = nftRuns.Load(), batches()
	if err := m.Teardown(a.ID); err != nil {
		t.Fatal(err)
	}
	if d := nftRuns.Load() - runs; d != 0 {
		t.Errorf("Teardown spawned %d nft processes, want none", d)
	}
	if d := batches() - n; d != 1 {
		t.Errorf("Teardown: %d netlink transactions on the bridge table, want 1", d)
	}
	got = same("teardown a")
	if strings.Contains(got, a.HostVeth) || !strings.Contains(got, b.HostVeth) {
		t.Errorf("after Teardown of a: a's pin still there or b's gone:\n%s", got)
	}
}

// sameAsScript checks that the inet table of m holds exactly what the nft script of
// the same members makes: it lists the table, rebuilds it with nft from the Manager's
// members (tableLocked), lists it again and compares, and returns the first listing.
// Listed twice: as nft prints it (-s: without counters, which the rebuild resets), and
// the kernel's expressions of every rule and the elements of every set (--debug=netlink),
// so two rules nft would print alike but that differ in the kernel do not pass either.
func sameAsScript(t *testing.T, m *Manager, step string) string {
	t.Helper()
	got, gotExprs := listTable(t, m.cfg.Table)
	m.pol.mu.Lock()
	err := runNft(m.tableLocked())
	m.pol.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	want, wantExprs := listTable(t, m.cfg.Table)
	if got != want {
		t.Fatalf("%s: over netlink:\n%s\nfrom the nft script:\n%s", step, got, want)
	}
	if gotExprs != wantExprs {
		t.Fatalf("%s: the kernel's expressions over netlink:\n%s\nfrom the nft script:\n%s", step, gotExprs, wantExprs)
	}
	return got
}

var anonSetName = regexp.MustCompile(`__set[0-9]+`)

// listTable lists the inet table twice (sameAsScript), with what differs between two
// equal tables made the same: the sets, maps and chains (listed in the order they were
// made) sorted, the elements of a set too (a hash set's order is its hash's), and the
// handles of rules and the kernel's numbers of anonymous sets left out.
func listTable(t *testing.T, table string) (text, exprs string) {
	t.Helper()
	out, err := exec.Command("nft", "-s", "list", "table", "inet", table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	var blocks []string
	for _, l := range strings.SplitAfter(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "\t\t") && l != "\t}\n":
			blocks = append(blocks, l) // set, map or chain
		case len(blocks) > 0 && strings.HasPrefix(l, "\t"):
			blocks[len(blocks)-1] += l
		}
	}
	slices.Sort(blocks)
	text = strings.Join(blocks, "")
	out, err = exec.Command("nft", "-s", "--debug=netlink", "list", "table", "inet", table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	dump, _, _ := strings.Cut(string(out), "table inet "+table+" {") // the listing after the dump
	if head, _, ok := strings.Cut(dump, "\n"); ok {
		// nft dumps again when the ruleset changed meanwhile (another table: tests run
		// in parallel): the last dump.
		dump = dump[strings.LastIndex(dump, head+"\n"):]
	}
	type block struct {
		head  string
		lines []string
	}
	var bs []*block
	for _, l := range strings.Split(anonSetName.ReplaceAllString(dump, "__set"), "\n") {
		if strings.HasPrefix(l, "inet ") {
			f := strings.Fields(l)
			if !strings.HasPrefix(f[2], "@") {
				f = f[:3] // a rule: "inet table chain handle [position]"
			}
			bs = append(bs, &block{head: strings.Join(f, " ")})
		} else if l != "" && len(bs) > 0 {
			bs[len(bs)-1].lines = append(bs[len(bs)-1].lines, l)
		}
	}
	chains := map[string]string{} // chain: its rules in order
	var sets []string
	for _, b := range bs {
		if strings.Contains(b.head, " @") {
			slices.Sort(b.lines)
			sets = append(sets, b.head+"\n"+strings.Join(b.lines, "\n"))
		} else {
			chains[b.head] += "rule\n" + strings.Join(b.lines, "\n") + "\n"
		}
	}
	slices.Sort(sets)
	for _, c := range sortedKeys(chains) {
		sets = append(sets, c+"\n"+chains[c])
	}
	return text, strings.Join(sets, "\n")
}

// TestSetRulesRetryAfterFailure: a change that failed (netlink and the nft rebuild both)
// leaves the old rules in force, and the same rules asked again are applied, not skipped
// as "already set" because the rules file (written first) already holds them: a retry
// must never leave the kernel with the older, possibly more open, rules.
func TestSetRulesRetryAfterFailure(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "rt-a-"+randHex(4))
	open := Rules{Org: "o1", Network: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}}
	if err := m.SetRules(a.ID, open); err != nil {
		t.Fatal(err)
	}
	narrow := Rules{Org: "o1", Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "203.0.113.0/24"}}}}
	// Both paths fail: the table is gone (netlink) and no nft is found (the rebuild).
	if err := deleteTable(m.cfg.Table); err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("PATH")
	t.Setenv("PATH", t.TempDir())
	if err := m.SetRules(a.ID, narrow); err == nil {
		t.Fatal("SetRules with neither netlink nor nft working: no error")
	}
	t.Setenv("PATH", path)
	if err := m.SetRules(a.ID, narrow); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	out, err := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
	if err != nil {
		t.Fatalf("the retry did not rebuild the table: %v %s", err, out)
	}
	if !strings.Contains(string(out), "203.0.113.0/24") {
		t.Fatalf("the retry's rules are not in force:\n%s", out)
	}
}
