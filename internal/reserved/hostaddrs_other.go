//go:build !linux

package reserved

import (
	"net"
	"net/netip"
)

// interfaceAddrs is the host's interface addresses (net.InterfaceAddrs).
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}
