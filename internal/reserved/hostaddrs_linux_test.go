package reserved

import (
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
)

// TestHostAddrsAsInterfaceAddrs: the one-dump reader finds the addresses
// net.InterfaceAddrs finds (retried: other processes on the host may add or remove
// interfaces between the two reads).
func TestHostAddrsAsInterfaceAddrs(t *testing.T) {
	var got, want []netip.Addr
	for range 5 {
		got = HostAddrs()
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		want = want[:0]
		for _, ia := range addrs {
			if n, ok := ia.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					want = append(want, ip.Unmap())
				}
			}
		}
		slices.SortFunc(got, netip.Addr.Compare)
		slices.SortFunc(want, netip.Addr.Compare)
		if len(want) > 0 && slices.Equal(got, want) {
			return
		}
	}
	t.Fatalf("HostAddrs() = %v, net.InterfaceAddrs = %v", got, want)
}

// TestIfaAddrPointToPoint: on a point-to-point link the local address is IFA_LOCAL, and
// IFA_ADDRESS (the peer's) is not the host's.
func TestIfaAddrPointToPoint(t *testing.T) {
	attr := func(typ uint16, b ...byte) syscall.NetlinkRouteAttr {
		return syscall.NetlinkRouteAttr{Attr: syscall.RtAttr{Type: typ}, Value: b}
	}
	for _, c := range []struct {
		name   string
		family uint8
		attrs  []syscall.NetlinkRouteAttr
		want   string
	}{
		{"address only", syscall.AF_INET, []syscall.NetlinkRouteAttr{attr(syscall.IFA_ADDRESS, 10, 0, 0, 1)}, "10.0.0.1"},
		{"peer and local", syscall.AF_INET, []syscall.NetlinkRouteAttr{attr(syscall.IFA_ADDRESS, 10, 0, 0, 2), attr(syscall.IFA_LOCAL, 10, 0, 0, 1)}, "10.0.0.1"},
		{"ipv6", syscall.AF_INET6, []syscall.NetlinkRouteAttr{attr(syscall.IFA_ADDRESS, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)}, "fe80::1"},
		{"label only", syscall.AF_INET, []syscall.NetlinkRouteAttr{attr(syscall.IFA_LABEL, 'l', 'o', 0)}, ""},
	} {
		a, ok := ifaAddr(c.family, c.attrs)
		if got := map[bool]string{true: a.String(), false: ""}[ok]; got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
