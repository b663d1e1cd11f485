package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Sandboxes are isolated from each other at layer 2 (isolated bridge ports). What one may
// reach of another is decided at layer 3 on the host: the bridge answers ARP for every
// sandbox address (proxy ARP, private-VLAN style), so sandbox-to-sandbox packets are
// routed through the host, where the forward chain lets through only a member of an
// organization reaching a port another member of the same organization declared
// private. Nothing inside a sandbox can change that.
//
// Organizations are numbered per Manager (nftables wants fixed-size keys): a sandbox's
// source address maps to its organization's number (map org_of), and the private ports
// are (address, protocol, port, number) elements (set private). The numbers live as long
// as the Manager: a restarted runner declares its sandboxes again.

// Port is a port of a sandbox that other sandboxes of its organization may reach.
type Port struct {
	Proto string // "tcp" or "udp"
	Port  uint16
}

type reach struct {
	mark  uint32
	ports []Port
}

type reachState struct {
	mu      sync.Mutex
	orgs    map[string]uint32
	members map[netip.Addr]reach
}

// SetReach makes the sandbox at ip a member of org and opens ports to the other members;
// it replaces what was set for ip before. An empty org makes it a member of none.
func (m *Manager) SetReach(ip netip.Addr, org string, ports []Port) error {
	if !ip.Is4() || !m.cfg.Subnet.Contains(ip) {
		return fmt.Errorf("network: reach: %v is not a sandbox address", ip)
	}
	for _, p := range ports {
		if (p.Proto != "tcp" && p.Proto != "udp") || p.Port == 0 {
			return fmt.Errorf("network: reach: invalid port %s/%d", p.Proto, p.Port)
		}
	}
	r := &m.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.orgs == nil {
		r.orgs, r.members = map[string]uint32{}, map[netip.Addr]reach{}
	}
	var b strings.Builder
	if old, ok := r.members[ip]; ok {
		m.reachElements(&b, "delete", ip, old)
	}
	if org == "" {
		if err := m.applyReach(b.String()); err != nil {
			return err
		}
		delete(r.members, ip)
		return nil
	}
	mark, ok := r.orgs[org]
	if !ok {
		mark = uint32(len(r.orgs) + 1)
		r.orgs[org] = mark
	}
	next := reach{mark: mark, ports: append([]Port(nil), ports...)}
	m.reachElements(&b, "add", ip, next)
	if err := m.applyReach(b.String()); err != nil {
		return err
	}
	r.members[ip] = next
	return nil
}

// clearReach forgets the sandbox at ip (Teardown).
func (m *Manager) clearReach(ip netip.Addr) error {
	r := &m.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.members[ip]
	if !ok {
		return nil
	}
	var b strings.Builder
	m.reachElements(&b, "delete", ip, old)
	delete(r.members, ip)
	return m.applyReach(b.String())
}

func (m *Manager) reachElements(b *strings.Builder, verb string, ip netip.Addr, r reach) {
	if verb == "add" {
		fmt.Fprintf(b, "add element inet %s org_of { %s : 0x%x }\n", m.cfg.Table, ip, r.mark)
	} else {
		fmt.Fprintf(b, "delete element inet %s org_of { %s }\n", m.cfg.Table, ip)
	}
	for _, p := range r.ports {
		fmt.Fprintf(b, "%s element inet %s private { %s . %s . %d . 0x%x }\n", verb, m.cfg.Table, ip, p.Proto, p.Port, r.mark)
	}
}

func (m *Manager) applyReach(script string) error {
	if script == "" {
		return nil
	}
	if err := runNft(script); err != nil {
		return fmt.Errorf("network: reach: %w", err)
	}
	return nil
}

// reachRules are the forward-chain rules (before the bridge's drop) and the sets they use.
func (m *Manager) reachSets() string {
	return `	map org_of {
		type ipv4_addr : mark
	}
	set private {
		type ipv4_addr . inet_proto . inet_service . mark
	}
`
}

func (m *Manager) reachRules(br string) string {
	return fmt.Sprintf(`		iifname %[1]s oifname %[1]s meta mark set ip saddr map @org_of
		iifname %[1]s oifname %[1]s ip daddr . meta l4proto . th dport . meta mark @private accept
`, br)
}

// enableProxyARP makes the bridge answer ARP for the sandboxes' addresses and keeps it
// from telling sandboxes to talk directly (which isolation would stop anyway).
func (m *Manager) enableProxyARP() error {
	var errs []error
	// Forwarding on the bridge alone (not the host-wide ip_forward): packets between
	// sandboxes enter and leave through it; everything else is the forward chain's call.
	for name, v := range map[string]string{"conf/%s/forwarding": "1", "conf/%s/proxy_arp": "1", "conf/%s/proxy_arp_pvlan": "1", "conf/%s/send_redirects": "0",
		// Answer at once: the default delays proxy replies by up to 0.8 s.
		"neigh/%s/proxy_delay": "0"} {
		p := filepath.Join("/proc/sys/net/ipv4", fmt.Sprintf(name, m.cfg.Bridge))
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: bridge sysctls: %w", err)
	}
	return nil
}
