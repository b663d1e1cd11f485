package local

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// readdAddress gives the sandbox side of attachment a its address and default route
// again. runsc takes over a network namespace's interfaces at boot and removes their
// addresses and routes from the host kernel's view (so that the host does not answer
// for the sandbox), and reads them again at restore: a checkpointed sandbox's namespace
// needs them back before `runsc restore`, which takes them over again.
func readdAddress(a *Attachment) error {
	if a == nil || !a.IP.IsValid() || a.NetNSPath == "" {
		return nil
	}
	ns, err := netns.GetFromPath(a.NetNSPath)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", a.NetNSPath, err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName(network.ContainerIface)
	if err != nil {
		return fmt.Errorf("%s: %w", network.ContainerIface, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.IP.AsSlice()), Mask: net.CIDRMask(a.PrefixLen, 32)}}
	if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add address: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s up: %w", network.ContainerIface, err)
	}
	if a.Gateway.IsValid() {
		route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(a.Gateway.AsSlice())}
		if err := h.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("default route: %w", err)
		}
	}
	return nil
}
