//go:build linux

package network

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
)

// rules returns the nftables script that (re)creates the Manager's table
// atomically, with the rules of every sandbox in members (see rules.go): the leading
// "table …; delete table …" pair makes the script idempotent, and nft applies the whole
// file as one transaction.
//
//   - input: from the bridge only replies (established/related), the platform DNS
//     (UDP and TCP 53 on the gateway address) and the egress proxy reach the host;
//     sandboxes cannot open other connections to any host address, including the
//     gateway and services on 0.0.0.0.
//   - forward: replies pass; sandbox to sandbox (routed through the host) goes to chain
//     peers; new connections into the bridge from elsewhere pass only to CUSTOM ports
//     (ingress_of) and are dropped otherwise; a sandbox's traffic to anywhere else meets
//     its egress chain (egress_of), and without Egress all of it is dropped. Sandboxes
//     get no IPv6 forwarding, and nothing from a source outside the subnet passes (the
//     rules are keyed by source address; a sandbox cannot send from an address other
//     than its own: its bridge port is pinned to its MAC and address, see antispoof.go).
//   - output: a new flow from the host itself into the bridge (any protocol, IPv4 or
//     IPv6) passes only with the socket mark Config.HostMark, which the edge's dials
//     carry; replies to the sandboxes' connections (established/related) pass. Refused
//     TCP gets a reset at once, so a host client fails fast with "connection refused"
//     (the same answer whether or not something listens; the sender is local, so a
//     silent drop would hide nothing and only hang it), the rest is dropped, which a
//     local sender also sees at once (EPERM). ARP is not in the inet family: the host
//     still resolves sandbox addresses, which its replies need.
//   - prerouting (nat): dns_name grants redirect TCP 443 to the proxy (dnat_of).
//   - postrouting (nat): masquerade the subnet leaving through any non-bridge
//     interface (Egress only).
//
// Layer-2 traffic between sandboxes never reaches netfilter; the bridge ports
// are "isolated" for that.
func (m *Manager) rules(members []*member) string {
	br := quote(m.cfg.Bridge)
	sub := m.cfg.Subnet.String()
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", m.cfg.Table, m.cfg.Table)
	fmt.Fprintf(&b, "table inet %s {\n", m.cfg.Table)
	fmt.Fprintf(&b, `	set reserved {
		type ipv4_addr; flags interval
		elements = { %s }
	}
	map org_of {
		type ipv4_addr : mark
	}
	set peer {
		type ipv4_addr . inet_proto . inet_service . mark
	}
	map caller_of {
		type ipv4_addr : mark
	}
	set peer_user {
		type ipv4_addr . inet_proto . inet_service . mark
	}
	set caller_member {
		type ipv4_addr . mark
	}
	map egress_of {
		type ipv4_addr : verdict
	}
	map ingress_of {
		type ipv4_addr : verdict
	}
	map dnat_of {
		type ipv4_addr : verdict
	}
`, m.reservedElements())
	proxy := ""
	if m.cfg.ProxyPort != 0 {
		proxy = fmt.Sprintf("\t\tiifname %s ip daddr %s tcp dport %d accept\n", br, m.gateway, m.cfg.ProxyPort)
	}
	fmt.Fprintf(&b, `	chain input {
		type filter hook input priority filter; policy accept;
		iifname %[1]s ct state established,related accept
		iifname %[1]s ip daddr %[3]s meta l4proto { tcp, udp } th dport 53 accept
%[4]s		iifname %[1]s drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname %[1]s ct state established,related accept
		oifname %[1]s ct state established,related accept
		iifname %[1]s meta nfproto ipv6 drop
		iifname %[1]s ip saddr != %[2]s drop
		iifname %[1]s oifname %[1]s goto peers
		oifname %[1]s ip daddr vmap @ingress_of
		oifname %[1]s drop
		iifname %[1]s ip daddr %[2]s drop
`, br, sub, m.gateway, proxy)
	if !m.cfg.Egress {
		fmt.Fprintf(&b, "\t\tiifname %s drop\n", br)
	}
	fmt.Fprintf(&b, `		iifname %[1]s ip saddr vmap @egress_of
	}
	chain peers {
		meta mark set 0
		meta mark set ip saddr map @org_of
		ip daddr . meta l4proto . th dport . meta mark @peer goto peer_egress
		meta mark set 0
		meta mark set ip saddr map @caller_of
		ip daddr . meta l4proto . th dport . meta mark @peer_user goto peer_egress
		drop
	}
	chain peer_egress {
		meta mark set 0
		meta mark set ip saddr map @caller_of
		ip saddr vmap @egress_of
		accept
	}
	chain output {
		type filter hook output priority filter; policy accept;
		oifname %[1]s ct state established,related accept
		oifname %[1]s meta mark %#[2]x accept
		oifname %[1]s meta l4proto tcp reject with tcp reset
		oifname %[1]s drop
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname %[1]s ip saddr vmap @dnat_of
	}
`, br, m.cfg.HostMark)
	if m.cfg.Egress {
		fmt.Fprintf(&b, `	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %s oifname != %s masquerade
	}
`, sub, br)
	}
	b.WriteString("}\n")
	for _, mem := range members {
		m.memberScript(&b, nil, mem)
	}
	return b.String()
}

func quote(s string) string { return `"` + s + `"` }

func applyRules(script string) error {
	if err := runNft(script); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	return nil
}

func deleteTable(table string) error {
	if err := runNft(fmt.Sprintf("table inet %s\ndelete table inet %s\n", table, table)); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", table, err)
	}
	return nil
}

// nftRuns counts nft processes spawned (runNft), for the tests that check the
// per-sandbox paths spawn none.
var nftRuns atomic.Int64

func runNft(script string) error {
	nftRuns.Add(1)
	nft, err := exec.LookPath("nft")
	if err != nil {
		return fmt.Errorf("nft not found (apt install nftables): %w", err)
	}
	cmd := exec.Command(nft, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}
