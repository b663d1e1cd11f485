package reserved

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
		if slices.Equal(got, want) { // both empty in a namespace with only lo down
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

// TestParseAddrDumpInterrupted: a dump the kernel marked NLM_F_DUMP_INTR (an address
// changed while it was read) is an error, not a list that may miss host addresses; an
// unmarked one gives its addresses.
func TestParseAddrDumpInterrupted(t *testing.T) {
	newaddr := func(flags uint16, ip ...byte) syscall.NetlinkMessage {
		ifam := make([]byte, syscall.SizeofIfAddrmsg)
		ifam[0] = syscall.AF_INET
		ifam[1] = 32
		attr := make([]byte, 4, 8)
		binary.NativeEndian.PutUint16(attr[0:], uint16(4+len(ip)))
		binary.NativeEndian.PutUint16(attr[2:], syscall.IFA_LOCAL)
		attr = append(attr, ip...)
		return syscall.NetlinkMessage{
			Header: syscall.NlMsghdr{Type: syscall.RTM_NEWADDR, Flags: flags | unix.NLM_F_MULTI},
			Data:   append(ifam, attr...),
		}
	}
	done := func(flags uint16) syscall.NetlinkMessage {
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: syscall.NLMSG_DONE, Flags: flags | unix.NLM_F_MULTI}, Data: make([]byte, 4)}
	}
	got, err := parseAddrDump([]syscall.NetlinkMessage{newaddr(0, 10, 0, 0, 1), newaddr(0, 192, 168, 1, 2), done(0)})
	if err != nil || !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.168.1.2")}) {
		t.Fatalf("clean dump: %v, %v", got, err)
	}
	for name, msgs := range map[string][]syscall.NetlinkMessage{
		"on an address": {newaddr(0, 10, 0, 0, 1), newaddr(unix.NLM_F_DUMP_INTR, 192, 168, 1, 2), done(0)},
		"on the done":   {newaddr(0, 10, 0, 0, 1), done(unix.NLM_F_DUMP_INTR)},
	} {
		if got, err := parseAddrDump(msgs); !errors.Is(err, errDumpInterrupted) {
			t.Errorf("interrupted %s: %v, %v; want errDumpInterrupted", name, got, err)
		}
	}
}
