//go:build linux

package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/sockmark"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Test resources are named so they cannot clash with a real runner:
// bridges "sbxt<4 hex>", tables "sbxtest_<hex>", helper links "sbxti…"/"sbxtd…",
// subnets 10.234.<n>.0/24, "internet" addresses in 198.18.0.0/15.

var (
	leftoverMu    sync.Mutex
	createdLinks  = map[string]bool{} // every link name the tests created (incl. host veths)
	createdTables = map[string]bool{}
	createdDirs   []string
)

func TestMain(m *testing.M) {
	fwd, _ := os.ReadFile(ipForwardPath)
	code := m.Run()
	if len(fwd) > 0 {
		cur, _ := os.ReadFile(ipForwardPath)
		if strings.TrimSpace(string(cur)) != strings.TrimSpace(string(fwd)) {
			fmt.Fprintf(os.Stderr, "ip_forward changed by tests (%s -> %s); restoring\n",
				strings.TrimSpace(string(fwd)), strings.TrimSpace(string(cur)))
			_ = os.WriteFile(ipForwardPath, fwd, 0o644)
			code = 1
		}
	}
	if testenv.HaveRoot() { // the tests that make links and tables ran
		if msg := leftovers(); msg != "" {
			fmt.Fprintln(os.Stderr, "LEFTOVERS after tests:", msg)
			code = 1
		}
	}
	os.Exit(code)
}

// leftovers reports test-created links, nft tables and mounts that still exist.
func leftovers() string {
	leftoverMu.Lock()
	defer leftoverMu.Unlock()
	var bad []string
	links, _ := netlink.LinkList()
	for _, l := range links {
		n := l.Attrs().Name
		if createdLinks[n] || strings.HasPrefix(n, "sbxt") {
			bad = append(bad, "link "+n)
		}
	}
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && (createdTables[f[2]] || strings.HasPrefix(f[2], "sbxtest_")) {
				bad = append(bad, "nft table "+f[2])
			}
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		for _, d := range createdDirs {
			if strings.Contains(line, d) {
				bad = append(bad, "mount "+line)
			}
		}
	}
	return strings.Join(bad, "; ")
}

func noteLink(name string) {
	leftoverMu.Lock()
	createdLinks[name] = true
	leftoverMu.Unlock()
}

// requireNetAdmin: the tests that make bridges, namespaces and nftables tables.
func requireNetAdmin(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t, "bridges, network namespaces, nftables")
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
}

func randByte() byte {
	var b [1]byte
	_, _ = rand.Read(b[:])
	return b[0]
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// freeTestSubnet picks a /24 in 10.234.0.0/16 that no host route overlaps.
func freeTestSubnet(t testing.TB) netip.Prefix { t.Helper(); return freeSubnet(t, 24) }

// freeSubnet picks a prefix of bits (16 to 24) in 10.234.0.0/16 that no host route overlaps.
func freeSubnet(t testing.TB, bits int) netip.Prefix {
	t.Helper()
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		var b [1]byte
		_, _ = rand.Read(b[:])
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 234, b[0], 0}), bits).Masked()
		clash := false
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			rp, err := netip.ParsePrefix(r.Dst.String())
			if err == nil && rp.Bits() > 0 && rp.Overlaps(p) {
				clash = true
			}
		}
		if !clash {
			return p
		}
	}
	t.Fatal("no free test subnet")
	return netip.Prefix{}
}

// testConfig returns a Config with its own bridge, subnet, table and state dir.
func testConfig(t testing.TB, egress bool) Config {
	t.Helper()
	h := randHex(2)
	cfg := Config{
		Bridge:      "sbxt" + h,
		Subnet:      freeTestSubnet(t),
		StateDir:    t.TempDir(),
		Nameservers: []string{},
		Egress:      egress,
		Table:       "sbxtest_" + h,
	}
	leftoverMu.Lock()
	createdLinks[cfg.Bridge] = true
	createdTables[cfg.Table] = true
	createdDirs = append(createdDirs, cfg.StateDir)
	leftoverMu.Unlock()
	return cfg
}

// newTestManager creates a Manager and registers Cleanup+Close.
func newTestManager(t testing.TB, egress bool) *Manager {
	t.Helper()
	requireNetAdmin(t)
	return newManagerFrom(t, testConfig(t, egress))
}

// newManagerFrom creates a Manager with cfg and registers Cleanup+Close.
func newManagerFrom(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		m.Close()
	})
	return m
}

func setup(t testing.TB, m *Manager, id string) *Attachment {
	t.Helper()
	noteLink(vethName(m.cfg.Bridge, id))
	a, err := m.Setup(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Teardown(id); err != nil {
			t.Errorf("Teardown(%s): %v", id, err)
		}
	})
	return a
}

// inNetNS runs fn on a fresh OS thread switched into the namespace at path.
// The thread is never unlocked, so it is discarded afterwards. Sockets created by
// fn stay in that namespace and may be used from any goroutine.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// serve starts a TCP server that answers every connection with
// "<name> <remote address>\n". path "" means the host namespace.
func serve(t testing.TB, path, addr, name string) net.Addr {
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
		t.Fatalf("listen %s in %q: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
	return ln.Addr()
}

// dial connects from the namespace at path ("" = host) and returns the server's line.
// From the host into a sandbox that needs the Manager's mark: dialMarked.
func dial(path, addr string, timeout time.Duration) (string, error) {
	return dialWith(path, addr, timeout, 0)
}

// dialMarked connects from the host with m's host mark, as the edge does: the only way
// from the host into a sandbox.
func dialMarked(m *Manager, addr string, timeout time.Duration) (string, error) {
	return dialWith("", addr, timeout, m.HostMark())
}

func dialWith(path, addr string, timeout time.Duration, mark uint32) (string, error) {
	var line string
	do := func() error {
		d := net.Dialer{Timeout: timeout, Control: sockmark.Control(mark)}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		line, err = bufio.NewReader(c).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		line = strings.TrimSpace(line)
		return nil
	}
	var err error
	if path == "" {
		err = do()
	} else {
		err = inNetNS(path, do)
	}
	return line, err
}

// internet is a network namespace playing "the internet": reached from the host
// over its own veth, with addresses in 198.18.0.0/15 (benchmark range).
type internet struct {
	nsPath   string
	hostAddr netip.Addr // host side of the link, the expected masquerade source
	addr     netip.Addr // the server's address inside
}

func newInternet(t testing.TB) *internet {
	t.Helper()
	x := randByte()
	in := &internet{
		nsPath:   t.TempDir() + "/inet",
		hostAddr: netip.AddrFrom4([4]byte{198, 18, x, 1}),
		addr:     netip.AddrFrom4([4]byte{198, 18, x, 2}),
	}
	linkedNS(t, in.nsPath, in.hostAddr, []netip.Prefix{netip.PrefixFrom(in.addr, 24)}, nil)
	return in
}

// linkedNS makes a network namespace at nsPath joined to the host by a veth pair and
// returns the host end's name: the host end (sbxti…) has hostAddr/24, the namespace's
// eth0 has addrs, and both it and lo are up. inside, when set, runs with a netlink
// handle in the namespace and its eth0 (for routes) before the link is synced. Both are
// removed when the test ends.
func linkedNS(t testing.TB, nsPath string, hostAddr netip.Addr, addrs []netip.Prefix, inside func(nh *netlink.Handle, eth netlink.Link)) string {
	t.Helper()
	if err := createNetNS(nsPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteNetNS(nsPath); err != nil {
			t.Error(err)
		}
	})
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	name := "sbxti" + randHex(3)
	noteLink(name)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, Flags: net.FlagUp, TxQLen: -1},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(nsh)),
		PeerTxQLen:    -1,
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) }) // gone already if the namespace went first
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(hostAddr, 24))}); err != nil {
		t.Fatal(err)
	}
	nh, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	eth, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := nh.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(a)}); err != nil {
			t.Fatalf("add %s: %v", a, err)
		}
	}
	if err := nh.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	if lo, err := nh.LinkByName("lo"); err == nil {
		_ = nh.LinkSetUp(lo)
	}
	if inside != nil {
		inside(nh, eth)
	}
	syncLink(nh, eth.Attrs().Index)
	// The host end too: its carrier came on with eth0, and until the kernel's deferred
	// linkwatch work runs it drops packets (the host's first SYN then waits a second for
	// its retransmit; TestEgressNAT's 1 s dial timed out so under load).
	if hl, err := netlink.LinkByName(name); err == nil {
		if hh, err := netlink.NewHandle(unix.NETLINK_ROUTE); err == nil {
			syncLink(hh, hl.Attrs().Index)
			hh.Close()
		}
	}
	return name
}
