package network

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Anti-spoofing: every sandbox's bridge port is pinned to the sandbox's own MAC and IPv4
// address. The inet table's rules are keyed by source address (egress_of, org_of,
// caller_of) and the host's neighbour table learns from ARP, so a sandbox that can craft
// frames (CAP_NET_RAW, which a container-engine sandbox has inside gVisor, whose
// netstack then sends what it is given) could otherwise send as another sandbox — take
// its egress grants, its organization's private ports — or poison the host's neighbour
// entry for another sandbox's address and receive its traffic.
//
// A bridge-family table of the same name as the inet one filters what enters the bridge
// from this Manager's ports (set ports), before anything else sees it (prerouting,
// priority -300):
//   - IPv4 passes only with the port's own MAC as the Ethernet source and the port's own
//     address as the IP source (set pins: port . MAC . address);
//   - ARP passes only with the port's own MAC as both the Ethernet and the ARP sender
//     hardware address, and the port's own address as the ARP sender address;
//   - everything else (IPv6, VLAN tags, other ether types) is dropped.
//
// Fail-closed: Setup pins the port before it is attached to the bridge and fails when
// pinning fails, so no sandbox port ever carries traffic unpinned. The Manager's pins
// are kept in memory (m.pins, restored from the records by New, which rebuilds the table
// in one transaction); the table holds exactly those.
//
// Layer 2 between sandboxes stays blocked by the isolated ports; this is about what
// reaches the host and, through it, the rules keyed by source address.

type pin struct {
	veth string
	mac  string
	ip   netip.Addr
}

func pinOf(a *Attachment) pin { return pin{veth: a.HostVeth, mac: a.MAC, ip: a.IP} }

func (p pin) element() string { return fmt.Sprintf("%s . %s . %s", quote(p.veth), p.mac, p.ip) }

// pinTable is the nft script that (re)creates the bridge table with pins, atomically.
func (m *Manager) pinTable(pins []pin) string {
	t := m.cfg.Table
	var b strings.Builder
	fmt.Fprintf(&b, "table bridge %s\ndelete table bridge %s\n", t, t)
	fmt.Fprintf(&b, "table bridge %s {\n", t)
	b.WriteString("\tset ports {\n\t\ttype ifname\n")
	if len(pins) > 0 {
		names := make([]string, len(pins))
		for i, p := range pins {
			names[i] = quote(p.veth)
		}
		fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(names, ", "))
	}
	b.WriteString("\t}\n\tset pins {\n\t\ttype ifname . ether_addr . ipv4_addr\n")
	if len(pins) > 0 {
		els := make([]string, len(pins))
		for i, p := range pins {
			els[i] = p.element()
		}
		fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(els, ", "))
	}
	b.WriteString(`	}
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		iifname != @ports accept
		ether type ip iifname . ether saddr . ip saddr @pins accept
		ether type arp iifname . ether saddr . arp saddr ip @pins iifname . arp saddr ether . arp saddr ip @pins accept
		ether type ip counter drop comment "spoofed ipv4"
		ether type arp counter drop comment "spoofed arp"
		counter drop comment "other"
	}
}
`)
	return b.String()
}

// restorePins rebuilds the bridge table from the records of the sandboxes under the
// state dir (New), dropping any pin a crash left without its record.
func (m *Manager) restorePins() error {
	ids, err := m.List()
	if err != nil {
		return fmt.Errorf("network: pins: %w", err)
	}
	m.pinMu.Lock()
	defer m.pinMu.Unlock()
	m.pins = map[string]pin{}
	for _, id := range ids {
		if a, err := m.readRecord(id); err == nil && a.HostVeth != "" && a.MAC != "" && a.IP.IsValid() {
			m.pins[id] = pinOf(a)
		}
	}
	return m.rebuildPinsLocked()
}

func (m *Manager) rebuildPinsLocked() error {
	ids := make([]string, 0, len(m.pins))
	for id := range m.pins {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	pins := make([]pin, len(ids))
	for i, id := range ids {
		pins[i] = m.pins[id]
	}
	if err := runNft(m.pinTable(pins)); err != nil {
		return fmt.Errorf("network: pin bridge ports: %w", err)
	}
	return nil
}

// pinPort pins sandbox id's port (before it is attached to the bridge): its two
// elements in one netlink transaction (pinsOverNetlink). Should that fail (the table was
// changed behind the Manager's back), the table is rebuilt with the pin by nft.
func (m *Manager) pinPort(id string, p pin) error {
	m.pinMu.Lock()
	defer m.pinMu.Unlock()
	err := m.pinsOverNetlink(p, false)
	if err == nil {
		m.pins[id] = p
		return nil
	}
	m.pins[id] = p
	if rerr := m.rebuildPinsLocked(); rerr != nil {
		delete(m.pins, id)
		return errors.Join(fmt.Errorf("pin bridge port %s: %w", p.veth, err), rerr)
	}
	return nil
}

// unpinPort removes sandbox id's pin (Teardown, undo of Setup), over netlink like
// pinPort. Should removing its elements fail, the table is rebuilt without them.
func (m *Manager) unpinPort(id string) error {
	m.pinMu.Lock()
	defer m.pinMu.Unlock()
	p, ok := m.pins[id]
	if !ok {
		return nil
	}
	delete(m.pins, id)
	if err := m.pinsOverNetlink(p, true); err != nil {
		if rerr := m.rebuildPinsLocked(); rerr != nil {
			m.pins[id] = p
			return errors.Join(fmt.Errorf("unpin bridge port %s: %w", p.veth, err), rerr)
		}
	}
	return nil
}

func deletePinTable(table string) error {
	if err := runNft(fmt.Sprintf("table bridge %s\ndelete table bridge %s\n", table, table)); err != nil {
		return fmt.Errorf("delete nftables bridge table %s: %w", table, err)
	}
	return nil
}
