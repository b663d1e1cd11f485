// Package reserved is the one home of the platform's reserved address ranges: the
// destinations no sandbox reaches whatever its egress rules ask (unless a runner's
// operator opens a range), that the egress proxy never dials for a dns_name grant, and
// (their host-local part) that the image puller never dials for a reference the
// operator did not configure.
package reserved

import (
	"net/netip"
	"slices"
)

// v4 and v6 are the platform's reserved ranges: "this" network, RFC 1918, CGNAT,
// loopback, link-local (cloud metadata lives at 169.254.169.254), multicast, reserved
// and broadcast (the test "internets" live in 198.18.0.0/15, the benchmarking range,
// which is not reserved here); IPv6 unspecified,
// loopback, IPv4-mapped, the NAT64 prefixes (the well-known 64:ff9b::/96 of RFC 6052 and
// the local-use 64:ff9b:1::/48 of RFC 8215: behind a NAT64 gateway they reach the IPv4
// address embedded in them, cloud metadata included), unique-local, link-local and
// multicast. A deployment adds its own (the sandbox subnet, the host's addresses:
// Set.Add).
var (
	v4 = []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	}
	v6 = []string{
		"::/128", "::1/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48",
		"fc00::/7", "fe80::/10", "ff00::/8",
	}
)

// V4 returns the reserved IPv4 prefixes (disjoint, sorted).
func V4() []netip.Prefix { return parse(v4) }

// V6 returns the reserved IPv6 prefixes (disjoint, sorted).
func V6() []netip.Prefix { return parse(v6) }

// Default is the set of every reserved range, IPv4 and IPv6.
func Default() Set { return NewSet(append(V4(), V6()...)...) }

func parse(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// HostLocal reports whether a is an address of the host itself or of its link whatever
// the deployment: unspecified, loopback, link-local (cloud metadata), multicast, or an
// IPv4-mapped form of one.
func HostLocal(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsUnspecified() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.Is4() && a.As4()[0] == 0
}

// HostAddrs returns the addresses of the host's interfaces (nil when they cannot be read).
func HostAddrs() []netip.Addr {
	addrs, err := interfaceAddrs()
	if err != nil {
		return nil
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
	}
	return addrs
}

// IsHostAddr reports whether a is one of the host's own addresses (true when they
// cannot be read: fail closed).
func IsHostAddr(a netip.Addr) bool {
	addrs, err := interfaceAddrs()
	if err != nil {
		return true
	}
	a = a.Unmap()
	for _, ip := range addrs {
		if ip.Unmap() == a {
			return true
		}
	}
	return false
}

// span is an inclusive address range of one family.
type span struct{ lo, hi netip.Addr }

// Set is an immutable set of addresses, kept as sorted, disjoint, non-adjacent ranges.
// The zero value is empty.
type Set struct{ spans []span }

// NewSet returns the set of the addresses of ps (IPv4-mapped prefixes count as IPv6).
func NewSet(ps ...netip.Prefix) Set { return Set{}.Add(ps...) }

// Add returns s with the addresses of ps.
func (s Set) Add(ps ...netip.Prefix) Set {
	spans := slices.Clone(s.spans)
	for _, p := range ps {
		if p.IsValid() {
			p = p.Masked()
			spans = append(spans, span{p.Addr(), last(p)})
		}
	}
	return Set{normalize(spans)}
}

// Remove returns s without the addresses of ps.
func (s Set) Remove(ps ...netip.Prefix) Set {
	spans := slices.Clone(s.spans)
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		p = p.Masked()
		lo, hi := p.Addr(), last(p)
		var out []span
		for _, sp := range spans {
			if sp.hi.Less(lo) || hi.Less(sp.lo) || sp.lo.Is4() != lo.Is4() {
				out = append(out, sp)
				continue
			}
			if sp.lo.Less(lo) {
				out = append(out, span{sp.lo, lo.Prev()})
			}
			if hi.Less(sp.hi) {
				out = append(out, span{hi.Next(), sp.hi})
			}
		}
		spans = out
	}
	return Set{normalize(spans)}
}

// Contains reports whether a (IPv4-mapped addresses as IPv4) is in s.
func (s Set) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, sp := range s.spans {
		if sp.lo.Is4() == a.Is4() && !a.Less(sp.lo) && !sp.hi.Less(a) {
			return true
		}
	}
	return false
}

// Covers reports whether every address of p is in s.
func (s Set) Covers(p netip.Prefix) bool {
	p = p.Masked()
	lo, hi := p.Addr(), last(p)
	for _, sp := range s.spans {
		if sp.lo.Is4() == lo.Is4() && !lo.Less(sp.lo) && !sp.hi.Less(hi) {
			return true
		}
	}
	return false
}

// Overlap returns the addresses of p that are in s, as the fewest prefixes.
func (s Set) Overlap(p netip.Prefix) []netip.Prefix {
	p = p.Masked()
	lo, hi := p.Addr(), last(p)
	var out []netip.Prefix
	for _, sp := range s.spans {
		if sp.lo.Is4() != lo.Is4() || sp.hi.Less(lo) || hi.Less(sp.lo) {
			continue
		}
		a, b := sp.lo, sp.hi
		if a.Less(lo) {
			a = lo
		}
		if hi.Less(b) {
			b = hi
		}
		out = append(out, rangePrefixes(a, b)...)
	}
	return out
}

// Prefixes returns s as the fewest prefixes, sorted (IPv4 first).
func (s Set) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, sp := range s.spans {
		out = append(out, rangePrefixes(sp.lo, sp.hi)...)
	}
	return out
}

// Prefixes4 returns the IPv4 part of s as the fewest prefixes.
func (s Set) Prefixes4() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s.Prefixes() {
		if p.Addr().Is4() {
			out = append(out, p)
		}
	}
	return out
}

// Prefixes6 returns the IPv6 part of s as the fewest prefixes.
func (s Set) Prefixes6() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s.Prefixes() {
		if p.Addr().Is6() {
			out = append(out, p)
		}
	}
	return out
}

// normalize sorts spans (IPv4 before IPv6) and merges overlapping and adjacent ones.
func normalize(spans []span) []span {
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	var out []span
	for _, sp := range spans {
		if n := len(out); n > 0 {
			prev := &out[n-1]
			if prev.lo.Is4() == sp.lo.Is4() && (!prev.hi.Less(sp.lo) || prev.hi.Next() == sp.lo) {
				if prev.hi.Less(sp.hi) {
					prev.hi = sp.hi
				}
				continue
			}
		}
		out = append(out, sp)
	}
	return out
}

// last is the highest address of p (which is masked).
func last(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		switch {
		case bits >= 8:
			bits -= 8
		case bits > 0:
			b[i] |= 0xff >> bits
			bits = 0
		default:
			b[i] = 0xff
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// rangePrefixes splits [lo, hi] into the fewest prefixes.
func rangePrefixes(lo, hi netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for {
		bits := lo.BitLen()
		// The shortest prefix that starts at lo and ends at or before hi.
		for bits > 0 {
			p := netip.PrefixFrom(lo, bits-1)
			if p.Masked().Addr() != lo || hi.Less(last(p.Masked())) {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(lo, bits)
		out = append(out, p)
		end := last(p)
		if end == hi || !end.Next().IsValid() {
			return out
		}
		lo = end.Next()
	}
}

// Egress is what no sandbox egress rule reaches on a runner: every reserved range but
// those its operator opened (open), plus the deployment's own ranges (extra: the sandbox
// subnet, the host's addresses), which cannot be opened.
func Egress(open []netip.Prefix, extra ...netip.Prefix) Set {
	return Default().Remove(open...).Add(extra...)
}
