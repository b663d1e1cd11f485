package reserved

import (
	"net/netip"
	"slices"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func strs(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func TestDefaultContains(t *testing.T) {
	s := Default()
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"169.254.169.254", true}, {"127.0.0.1", true}, {"10.1.2.3", true}, {"192.168.1.1", true},
		{"172.31.255.255", true}, {"100.64.0.1", true}, {"0.0.0.0", true}, {"224.0.0.1", true},
		{"255.255.255.255", true}, {"::1", true}, {"fe80::1", true}, {"fd00::1", true}, {"::ffff:127.0.0.1", true},
		{"8.8.8.8", false}, {"172.32.0.1", false}, {"100.128.0.1", false}, {"2001:4860::8888", false}, {"198.51.100.1", false},
	} {
		if got := s.Contains(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Contains(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
}

func TestCoversAndOverlap(t *testing.T) {
	s := Default()
	for _, c := range []struct {
		cidr    string
		covers  bool
		overlap []string
	}{
		{"169.254.169.254/32", true, []string{"169.254.169.254/32"}},
		{"192.168.0.0/16", true, []string{"192.168.0.0/16"}},
		{"10.0.0.0/8", true, []string{"10.0.0.0/8"}},
		{"127.0.0.0/8", true, []string{"127.0.0.0/8"}},
		{"8.8.8.0/24", false, nil},
		{"192.0.0.0/8", false, []string{"192.168.0.0/16"}},
		{"0.0.0.0/0", false, []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
			"172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/3"}},
		{"::/0", false, []string{"::/127", "::ffff:0.0.0.0/96", "64:ff9b::/96", "64:ff9b:1::/48", "fc00::/7", "fe80::/10", "ff00::/8"}},
		// NAT64: behind a translator these reach the IPv4 address they embed.
		{"64:ff9b::a9fe:a9fe/128", true, []string{"64:ff9b::a9fe:a9fe/128"}},
		{"64:ff9b:1:2::/64", true, []string{"64:ff9b:1:2::/64"}},
		{"64:ff9b::/64", false, []string{"64:ff9b::/96"}},
	} {
		p := netip.MustParsePrefix(c.cidr)
		if got := s.Covers(p); got != c.covers {
			t.Errorf("Covers(%s) = %v, want %v", c.cidr, got, c.covers)
		}
		if got := strs(s.Overlap(p)); !slices.Equal(got, c.overlap) {
			t.Errorf("Overlap(%s) = %v, want %v", c.cidr, got, c.overlap)
		}
	}
}

// TestEgressOpen: a range the operator opens leaves the set (only that range), the
// deployment's own ranges never do.
func TestEgressOpen(t *testing.T) {
	s := Egress(prefixes("10.20.0.0/16", "10.88.0.0/16"), netip.MustParsePrefix("10.88.0.0/16"))
	for _, c := range []struct {
		addr string
		want bool
	}{{"10.20.1.1", false}, {"10.21.0.1", true}, {"10.19.255.255", true}, {"10.88.0.5", true}, {"169.254.169.254", true}} {
		if got := s.Contains(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Contains(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	if s.Covers(netip.MustParsePrefix("10.20.0.0/16")) {
		t.Error("an opened range is still covered")
	}
	if got := strs(s.Overlap(netip.MustParsePrefix("10.0.0.0/8"))); !slices.Equal(got, []string{
		"10.0.0.0/12", "10.16.0.0/14", "10.21.0.0/16", "10.22.0.0/15", "10.24.0.0/13", "10.32.0.0/11", "10.64.0.0/10", "10.128.0.0/9",
	}) {
		t.Errorf("Overlap(10/8) = %v", got)
	}
}

func TestSetRoundTrip(t *testing.T) {
	s := NewSet(prefixes("10.0.0.0/9", "10.128.0.0/9", "10.0.0.0/24", "11.0.0.0/8")...)
	if got := strs(s.Prefixes()); !slices.Equal(got, []string{"10.0.0.0/7"}) {
		t.Errorf("merged = %v", got)
	}
	s = s.Remove(netip.MustParsePrefix("10.0.0.0/8"))
	if got := strs(s.Prefixes()); !slices.Equal(got, []string{"11.0.0.0/8"}) {
		t.Errorf("after remove = %v", got)
	}
	if got := strs(NewSet(netip.MustParsePrefix("0.0.0.0/0")).Prefixes()); !slices.Equal(got, []string{"0.0.0.0/0"}) {
		t.Errorf("all = %v", got)
	}
}

func TestHostLocal(t *testing.T) {
	for _, c := range []struct {
		addr string
		want bool
	}{{"127.0.0.1", true}, {"::1", true}, {"169.254.169.254", true}, {"0.0.0.0", true}, {"::ffff:127.0.0.1", true}, {"fe80::1", true},
		{"10.0.0.1", false}, {"8.8.8.8", false}} {
		if got := HostLocal(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("HostLocal(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	if !IsHostAddr(netip.MustParseAddr("127.0.0.1")) {
		t.Error("IsHostAddr(127.0.0.1) = false")
	}
}
