package testbed

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// network is the bed's wiring: a host bridge holding the control plane's and gateways'
// side, and per runner a network namespace joined to it by a veth pair, so every runner
// has an address of its own that only the bridge reaches (its own "cluster").
type network struct {
	tag    string       // unique per bed; prefixes every name
	bridge string       // host bridge
	prefix netip.Prefix // /24 on the bridge
	host   netip.Addr   // the bridge's address: control plane and gateways listen here
	ns     []string     // namespace names, one per runner
}

func newNetwork(id int) *network {
	tag := fmt.Sprintf("tb%04x", id&0xffff)
	p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(180 + id%20), byte(id / 20 % 256), 0}), 24)
	return &network{tag: tag, bridge: tag + "br", prefix: p, host: p.Addr().Next()}
}

// runnerAddr is runner i's address.
func (n *network) runnerAddr(i int) netip.Addr {
	a := n.prefix.Addr().As4()
	a[3] = byte(10 + i)
	return netip.AddrFrom4(a)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// up creates the bridge and one namespace per runner.
func (n *network) up(runners int) error {
	bits := fmt.Sprintf("/%d", n.prefix.Bits())
	steps := [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", n.host.String() + bits, "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	for i := range runners {
		ns := fmt.Sprintf("%s-r%d", n.tag, i)
		hostEnd, nsEnd := fmt.Sprintf("%sv%d", n.tag, i), fmt.Sprintf("%sp%d", n.tag, i)
		n.ns = append(n.ns, ns)
		steps := [][]string{
			{"netns", "add", ns},
			{"link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd},
			{"link", "set", hostEnd, "master", n.bridge},
			{"link", "set", hostEnd, "up"},
			{"link", "set", nsEnd, "netns", ns},
			{"-n", ns, "link", "set", nsEnd, "name", "eth0"},
			{"-n", ns, "addr", "add", n.runnerAddr(i).String() + bits, "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", ns, "route", "add", "default", "via", n.host.String()},
		}
		for _, s := range steps {
			if err := ip(s...); err != nil {
				return err
			}
		}
	}
	return nil
}

// down removes what up made (deleting a namespace removes its veth end and the peer).
func (n *network) down() {
	for _, ns := range n.ns {
		_ = ip("netns", "delete", ns)
	}
	_ = ip("link", "delete", n.bridge)
	n.ns = nil
}

// nsExec is the command line that runs argv inside runner i's namespace.
func (n *network) nsExec(i int, argv ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + n.ns[i], "--"}, argv...)
}
