//go:build linux

package network

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestDisableIPv6SmallMTU: a link whose MTU is below IPv6's minimum (1280) has no
// conf/<name> in /proc/sys/net/ipv6 (the kernel gives it no IPv6), which is nothing to
// turn off rather than an error (Setup failed for every sandbox with Config.MTU < 1280);
// on a link with IPv6 it is turned off.
func TestDisableIPv6SmallMTU(t *testing.T) {
	requireNetAdmin(t)
	if _, err := os.Stat("/proc/sys/net/ipv6/conf"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	errc := make(chan string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in its own namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err.Error()
			return
		}
		var msgs []string
		for _, c := range []struct {
			name string
			mtu  int
		}{{"small0", 1200}, {"big0", 1500}} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: c.name, MTU: c.mtu}, PeerName: c.name + "p", PeerMTU: uint32(c.mtu)}); err != nil {
				msgs = append(msgs, "add "+c.name+": "+err.Error())
				continue
			}
			if err := disableIPv6(c.name); err != nil {
				msgs = append(msgs, c.name+": "+err.Error())
			}
		}
		if _, err := os.Stat("/proc/sys/net/ipv6/conf/small0"); err == nil {
			msgs = append(msgs, "small0 has an IPv6 conf: the test does not test the missing file")
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/big0/disable_ipv6"); err != nil || strings.TrimSpace(string(b)) != "1" {
			msgs = append(msgs, "big0: disable_ipv6 = "+string(b))
		}
		errc <- strings.Join(msgs, "; ")
	}()
	if msg := <-errc; msg != "" {
		t.Fatal(msg)
	}
}

// TestSetupSmallMTU: a sandbox network with an MTU below IPv6's minimum sets up (its
// host veth has no IPv6 conf to turn off).
func TestSetupSmallMTU(t *testing.T) {
	requireNetAdmin(t)
	cfg := testConfig(t, false)
	cfg.MTU = 1200
	m := newManagerFrom(t, cfg)
	a := setup(t, m, "mtu-"+randHex(4))
	l, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1200 {
		t.Errorf("host veth MTU %d, want 1200", l.Attrs().MTU)
	}
}
