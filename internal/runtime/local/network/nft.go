//go:build linux

package network

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// rules returns the nftables script that (re)creates the Manager's table
// atomically: the leading "table …; delete table …" pair makes the script
// idempotent, and nft applies the whole file as one transaction.
//
//   - input: from the bridge only replies (established/related) reach the host;
//     sandboxes cannot open connections to any host address, including the
//     gateway and services on 0.0.0.0.
//   - forward: replies pass; new connections into the bridge from elsewhere
//     (and bridge to bridge, i.e. sandbox to sandbox when routed) are dropped;
//     sandbox traffic to the subnet is dropped; without Egress all other
//     sandbox traffic is dropped as well. Sandboxes get no IPv6 forwarding.
//   - postrouting: masquerade the subnet leaving through any non-bridge
//     interface (Egress only).
//
// Layer-2 traffic between sandboxes never reaches netfilter; the bridge ports
// are "isolated" for that.
func (m *Manager) rules() string {
	br := quote(m.cfg.Bridge)
	sub := m.cfg.Subnet.String()
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", m.cfg.Table, m.cfg.Table)
	fmt.Fprintf(&b, "table inet %s {\n", m.cfg.Table)
	b.WriteString(m.reachSets())
	fmt.Fprintf(&b, `	chain input {
		type filter hook input priority filter; policy accept;
		iifname %[1]s ct state established,related accept
		iifname %[1]s drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname %[1]s ct state established,related accept
		oifname %[1]s ct state established,related accept
%[3]s		oifname %[1]s drop
		iifname %[1]s ip daddr %[2]s drop
		iifname %[1]s meta nfproto ipv6 drop
`, br, sub, m.reachRules(br))
	if !m.cfg.Egress {
		fmt.Fprintf(&b, "\t\tiifname %s drop\n", br)
	}
	b.WriteString("\t}\n")
	if m.cfg.Egress {
		fmt.Fprintf(&b, `	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr %s oifname != %s masquerade
	}
`, sub, br)
	}
	b.WriteString("}\n")
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

func runNft(script string) error {
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
