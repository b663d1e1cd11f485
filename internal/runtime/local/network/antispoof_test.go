//go:build linux

package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestAntiSpoof: a sandbox that crafts its own frames (CAP_NET_RAW, as a container
// engine has inside gVisor) cannot send as another sandbox from its bridge port: ARP
// claiming another sandbox's address does not poison the host's neighbour entry, a
// foreign source MAC is not learnt on its port, an IPv4 packet with another sandbox's
// source address is dropped, and IPv6 does not pass. Its own frames pass (the control:
// the host learns its own address from its ARP request).
func TestAntiSpoof(t *testing.T) {
	m := newTestManager(t, false)
	a := setup(t, m, "spoofa"+randHex(3))
	b := setup(t, m, "spoofb"+randHex(3))
	aMAC, _ := net.ParseMAC(a.MAC)
	bMAC, _ := net.ParseMAC(b.MAC)
	gw := m.Gateway()
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	aPort, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}

	// Control: A's own ARP request reaches the host, which learns A's address.
	arps, ips, others := dropCount(t, m, "spoofed arp"), dropCount(t, m, "spoofed ipv4"), dropCount(t, m, "other")
	sendFrame(t, a.NetNSPath, arpFrame(aMAC, aMAC, a.IP, gw))
	if !waitFor(2*time.Second, func() bool { return neighMAC(br.Attrs().Index, a.IP) == a.MAC }) {
		t.Fatalf("control: the host did not learn %s at %s from its own ARP request (neighbour %q)", a.IP, a.MAC, neighMAC(br.Attrs().Index, a.IP))
	}
	if d := dropCount(t, m, "spoofed arp"); d != arps {
		t.Fatalf("control: A's own ARP request was dropped (%d -> %d)", arps, d)
	}

	// ARP from A's port claiming B's address, with A's MAC: the host would send B's
	// traffic to A.
	sendFrame(t, a.NetNSPath, arpFrame(aMAC, aMAC, b.IP, gw))
	time.Sleep(200 * time.Millisecond)
	if got := neighMAC(br.Attrs().Index, b.IP); got == a.MAC {
		t.Errorf("the host's neighbour entry for %s (B) is A's MAC %s: ARP spoofing passed", b.IP, got)
	}
	// ARP from A's port as B entirely (B's MAC in the frame and the ARP sender): the
	// bridge would learn B's MAC on A's port.
	sendFrame(t, a.NetNSPath, arpFrame(bMAC, bMAC, b.IP, gw))
	// ARP with A's Ethernet source but B's MAC as the ARP sender.
	sendFrame(t, a.NetNSPath, arpFrame(aMAC, bMAC, b.IP, gw))
	// IPv4 with B's source address (A's MAC), to the gateway: rules keyed by source
	// address would take it for B's.
	sendFrame(t, a.NetNSPath, ipv4Frame(aMAC, bridgeMAC(m.cfg.Bridge), b.IP, gw))
	// IPv6 (sandboxes get none).
	sendFrame(t, a.NetNSPath, ipv6Frame(aMAC))
	// Exactly ours for ARP and IPv4; the namespace's own IPv6 (router solicitations)
	// lands in "other" too.
	if !waitFor(2*time.Second, func() bool {
		return dropCount(t, m, "spoofed arp") == arps+3 && dropCount(t, m, "spoofed ipv4") == ips+1 && dropCount(t, m, "other") > others
	}) {
		t.Errorf("dropped: %d ARP (want 3), %d IPv4 (want 1), %d other (want >= 1)",
			dropCount(t, m, "spoofed arp")-arps, dropCount(t, m, "spoofed ipv4")-ips, dropCount(t, m, "other")-others)
	}
	fdb, err := netlink.NeighList(aPort.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range fdb {
		if n.HardwareAddr.String() == b.MAC {
			t.Errorf("the bridge learnt B's MAC %s on A's port %s", b.MAC, a.HostVeth)
		}
	}
	// A's own IPv4 passes the bridge table (what the inet table does with it is its
	// business).
	before := dropCount(t, m, "spoofed ipv4")
	sendFrame(t, a.NetNSPath, ipv4Frame(aMAC, bridgeMAC(m.cfg.Bridge), a.IP, gw))
	time.Sleep(200 * time.Millisecond)
	if d := dropCount(t, m, "spoofed ipv4"); d != before {
		t.Errorf("A's own IPv4 packet was dropped (%d -> %d)", before, d)
	}
}

// TestAntiSpoofRestored: a new Manager on the same state (a restarted runner) pins the
// ports of the sandboxes it finds, and a torn-down sandbox's pin is gone.
func TestAntiSpoofRestored(t *testing.T) {
	m := newTestManager(t, false)
	a := setup(t, m, "pina"+randHex(3))
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	out := listPins(t, m)
	if !regexp.MustCompile(regexp.QuoteMeta(fmt.Sprintf("%q . %s . %s", a.HostVeth, a.MAC, a.IP))).MatchString(out) {
		t.Fatalf("after New the bridge table lacks %s's pin:\n%s", a.HostVeth, out)
	}
	if err := m2.Teardown(a.ID); err != nil {
		t.Fatal(err)
	}
	if out := listPins(t, m); regexp.MustCompile(regexp.QuoteMeta(a.HostVeth)).MatchString(out) {
		t.Fatalf("after Teardown the bridge table still pins %s:\n%s", a.HostVeth, out)
	}
}

func listPins(t *testing.T, m *Manager) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "bridge", m.cfg.Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

// dropCount is the packet count of the bridge table's drop rule with comment kind
// ("spoofed ipv4", "spoofed arp", "other").
func dropCount(t *testing.T, m *Manager, kind string) int {
	t.Helper()
	dropCounter := regexp.MustCompile(`counter packets (\d+) bytes \d+ drop comment "` + kind + `"`)
	out, err := exec.Command("nft", "list", "chain", "bridge", m.cfg.Table, "pre").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list chain: %v: %s", err, out)
	}
	sm := dropCounter.FindSubmatch(out)
	if sm == nil {
		t.Fatalf("no drop counter in:\n%s", out)
	}
	n, _ := strconv.Atoi(string(sm[1]))
	return n
}

func waitFor(d time.Duration, ok func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if ok() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// neighMAC is the host's neighbour entry for ip on link index, "" without one.
func neighMAC(index int, ip netip.Addr) string {
	ns, err := netlink.NeighList(index, unix.AF_INET)
	if err != nil {
		return ""
	}
	for _, n := range ns {
		if n.IP.Equal(net.IP(ip.AsSlice())) && n.HardwareAddr != nil {
			return n.HardwareAddr.String()
		}
	}
	return ""
}

// sendFrame sends one raw Ethernet frame out of eth0 in the namespace at path.
func sendFrame(t *testing.T, path string, frame []byte) {
	t.Helper()
	err := inNetNS(path, func() error {
		ifi, err := net.InterfaceByName(ContainerIface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(sa.Addr[:], frame[:6])
		return unix.Sendto(fd, frame, 0, sa)
	})
	if err != nil {
		t.Fatalf("send frame: %v", err)
	}
}

func ether(dst, src net.HardwareAddr, typ uint16) []byte {
	f := make([]byte, 14)
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], typ)
	return f
}

// arpFrame is an ARP request for target from Ethernet source src, sender sha/spa.
func arpFrame(src, sha net.HardwareAddr, spa, target netip.Addr) []byte {
	f := ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src, 0x0806)
	a := make([]byte, 28)
	binary.BigEndian.PutUint16(a[0:2], 1)      // Ethernet
	binary.BigEndian.PutUint16(a[2:4], 0x0800) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 1) // request
	copy(a[8:14], sha)
	s4, t4 := spa.As4(), target.As4()
	copy(a[14:18], s4[:])
	copy(a[24:28], t4[:])
	return append(f, a...)
}

// ipv4Frame is an ICMP echo request from src to dst.
func ipv4Frame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr) []byte {
	f := ether(dstMAC, srcMAC, 0x0800)
	icmp := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
	binary.BigEndian.PutUint16(icmp[2:4], checksum(icmp))
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(h[2:4], uint16(len(h)+len(icmp)))
	s4, d4 := src.As4(), dst.As4()
	copy(h[12:16], s4[:])
	copy(h[16:20], d4[:])
	binary.BigEndian.PutUint16(h[10:12], checksum(h))
	return append(append(f, h...), icmp...)
}

// ipv6Frame is a minimal IPv6 packet (no next header) to the all-nodes group.
func ipv6Frame(src net.HardwareAddr) []byte {
	f := ether(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, src, 0x86dd)
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, 59, 1
	h[8], h[9] = 0xfe, 0x80
	h[23] = 1
	h[24], h[25], h[39] = 0xff, 0x02, 1
	return append(f, h...)
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
