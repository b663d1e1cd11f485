//go:build linux

package network

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestElementsOverNetlink: rules without chains, or with an egress chain of the rules
// the API's defaults give (ruleExprs), go over netlink (setElements, one transaction each), and the table then
// holds exactly what the nft script of the same members makes: listed after
// each change, then after rebuilding the whole table with nft from the same members, the
// two listings are equal. Changes replace (new organization, caller and ports: the old
// elements are gone) and Teardown removes them.
func TestElementsOverNetlink(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "nl-a-"+randHex(4))
	b := setup(t, m, "nl-b-"+randHex(4))
	list := func() string {
		t.Helper()
		out, err := exec.Command("nft", "list", "table", "inet", m.cfg.Table).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	same := func(step string) string {
		t.Helper()
		got := list()
		m.pol.mu.Lock()
		err := runNft(m.tableLocked())
		m.pol.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if want := list(); got != want {
			t.Fatalf("%s: over netlink:\n%s\nfrom the nft script:\n%s", step, got, want)
		}
		return got
	}
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

// BenchmarkSetRules: one sandbox's rules set and cleared (a warm claim and its
// teardown), the API's default (an egress chain allowing nothing), a policy's default
// (same_org and any) and elements only:
// through change (over netlink) and, the A/B, the same member's nft script (how change
// applied it before); and rules with an allow rule (nft either way).
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
