package network

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// WriteEtcFiles writes dir/hosts, dir/hostname and dir/resolv.conf for
// bind-mounting into a sandbox's /etc. a may be nil (no network): the hostname
// then resolves to 127.0.1.1. With no nameservers, resolv.conf holds only a
// comment. Files are replaced atomically.
func WriteEtcFiles(dir, hostname string, a *Attachment, nameservers []string) error {
	if hostname == "" || len(hostname) > 253 || strings.ContainsAny(hostname, " \t\r\n#/\x00") {
		return fmt.Errorf("network: invalid hostname %q", hostname)
	}
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1\tlocalhost\n")
	hosts.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	if a != nil && a.IP.IsValid() {
		fmt.Fprintf(&hosts, "%s\t%s\n", a.IP, hostname)
	} else {
		fmt.Fprintf(&hosts, "127.0.1.1\t%s\n", hostname)
	}

	var resolv strings.Builder
	n := 0
	for _, ns := range nameservers {
		addr, err := netip.ParseAddr(strings.TrimSpace(ns))
		if err != nil {
			return fmt.Errorf("network: invalid nameserver %q", ns)
		}
		fmt.Fprintf(&resolv, "nameserver %s\n", addr)
		n++
	}
	if n == 0 {
		resolv.WriteString("# no nameservers configured for this sandbox\n")
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	for name, content := range map[string]string{
		"hosts":       hosts.String(),
		"hostname":    hostname + "\n",
		"resolv.conf": resolv.String(),
	} {
		if err := writeFileAtomic(filepath.Join(dir, name), content); err != nil {
			return err
		}
	}
	return nil
}

func writeFileAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// HostNameservers returns the IPv4, non-loopback, non-unspecified nameservers
// of a resolv.conf file (sandboxes have no IPv6 connectivity, and the host's
// loopback resolvers, e.g. systemd-resolved's 127.0.0.53, are not reachable
// from a sandbox). A missing or unreadable file gives none.
func HostNameservers(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || !a.Is4() || a.IsLoopback() || a.IsUnspecified() {
			continue
		}
		out = append(out, a.String())
	}
	return out
}
