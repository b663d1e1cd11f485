package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// MaxSourceIPAllowlist bounds control_plane_access.source_ip_allowlist.
const MaxSourceIPAllowlist = 256

// ConstraintSourceIPAllowlist names the source-IP allowlist in violations and errors.
const ConstraintSourceIPAllowlist = "control_plane_access.source_ip_allowlist"

// ControlPlaneAccess limits the Sandbox API calls for a runner's sandboxes by the
// caller (the target's control_plane_access). Its zero value limits nothing.
type ControlPlaneAccess struct {
	// SourceIPAllowlist lists the caller addresses (CIDRs such as "203.0.113.0/24" or
	// single addresses such as "198.51.100.7" or "2001:db8::1") allowed to place sandboxes
	// on the runner and to operate on its sandboxes. Absent (null) allows every address;
	// an empty list ([]) allows none. At most MaxSourceIPAllowlist entries.
	SourceIPAllowlist []string `json:"source_ip_allowlist,omitzero"`
}

// parseAllowEntry parses one allowlist entry: a CIDR or a single address (a /32 or
// /128). Zones, non-canonical CIDRs (host bits set) and IPv4-mapped IPv6 forms are
// refused so that what an administrator reads is what is matched.
func parseAllowEntry(s string) (netip.Prefix, error) {
	if s != strings.TrimSpace(s) || s == "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR such as 203.0.113.0/24", s)
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 203.0.113.0/24", s)
		}
		if p.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("%q: write IPv4 prefixes in IPv4 form", s)
		}
		if p.Masked() != p {
			return netip.Prefix{}, fmt.Errorf("%q has host bits set: did you mean %s?", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR such as 203.0.113.0/24", s)
	}
	if a.Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q: write IPv4 addresses in IPv4 form", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// validateControlPlaneAccess reports the errors of p's control_plane_access.
func validateControlPlaneAccess(a ControlPlaneAccess, add func(field, format string, args ...any)) {
	const f = "policy.control_plane_access.source_ip_allowlist"
	if n := len(a.SourceIPAllowlist); n > MaxSourceIPAllowlist {
		add(f, "at most %d entries, got %d", MaxSourceIPAllowlist, n)
		return
	}
	for i, e := range a.SourceIPAllowlist {
		if _, err := parseAllowEntry(e); err != nil {
			add(fmt.Sprintf("%s[%d]", f, i), "%v", err)
		}
	}
}

// SourceAllowed reports whether p (nil: the empty policy) lets a caller from addr use
// the Sandbox API for the runner's sandboxes: no allowlist allows everyone; otherwise
// addr must be inside an entry. An invalid address (unknown caller) is allowed only
// without an allowlist. IPv4-mapped IPv6 callers are matched as IPv4; entries that do
// not parse (a policy that was never validated) match nothing.
func SourceAllowed(p *Policy, addr netip.Addr) bool {
	if p == nil || p.ControlPlaneAccess.SourceIPAllowlist == nil {
		return true
	}
	if !addr.IsValid() {
		return false
	}
	addr = addr.Unmap().WithZone("")
	for _, e := range p.ControlPlaneAccess.SourceIPAllowlist {
		if pr, err := parseAllowEntry(e); err == nil && pr.Contains(addr) {
			return true
		}
	}
	return false
}

// SourceViolation is the violation of a runner whose allowlist excludes addr (for
// placement's "no runner accepts" error): its field names the constraint.
func SourceViolation(runnerID string, addr netip.Addr) apierr.Violation {
	return apierr.Violation{Field: "runner[" + runnerID + "]." + ConstraintSourceIPAllowlist,
		Description: fmt.Sprintf("the runner's policy does not allow Sandbox API calls from %s (%s)", AddrString(addr), ConstraintSourceIPAllowlist)}
}

// AddrString formats a caller address for messages ("unknown" when invalid).
func AddrString(addr netip.Addr) string {
	if !addr.IsValid() {
		return "an unknown address"
	}
	return addr.Unmap().String()
}
