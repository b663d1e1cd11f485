package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// rule is one rule of a sandbox's own chains (e…, i…, n…: rules.go): matches, then a
// verdict or a dnat. It is the one description of the rule: String is its nft text (for
// the scripts, nft.go) and kernelRule (nftnl.go) its kernel form for netlink, the
// expressions nft compiles that text to.
type rule struct {
	match   []match
	verdict string         // accept, drop or return; "" with dnat
	dnat    netip.AddrPort // "dnat ip to" (valid: instead of a verdict)
}

type matchKind uint8

const (
	nfprotoV4    matchKind = iota // meta nfproto ipv4
	addrIn                        // ip daddr|saddr P (prefixes[0])
	addrNotIn                     // ip daddr|saddr != { P, … } (prefixes: the fewest, sorted)
	notReserved                   // ip daddr|saddr != @reserved
	callerMember                  // ip daddr . meta mark @caller_member
	dports                        // meta l4proto P th dport { ports }
	localDst                      // fib daddr type local
)

// match is one match of a rule.
type match struct {
	kind     matchKind
	saddr    bool           // the source address, else the destination
	prefixes []netip.Prefix // addrIn, addrNotIn
	proto    string         // dports: tcp, udp or sctp
	ports    []portRange    // dports: sorted, neither overlapping nor adjacent (mergeRanges)
}

// portRange is the ports lo to hi, both included.
type portRange struct{ lo, hi uint16 }

func newRule(verdict string, ms ...[]match) rule {
	r := rule{verdict: verdict}
	for _, m := range ms {
		r.match = append(r.match, m...)
	}
	return r
}

func (r rule) String() string {
	var b strings.Builder
	for _, x := range r.match {
		b.WriteString(x.String())
		b.WriteByte(' ')
	}
	if r.dnat.IsValid() {
		b.WriteString("dnat ip to " + r.dnat.String())
	} else {
		b.WriteString(r.verdict)
	}
	return b.String()
}

func (x match) String() string {
	field := "ip daddr"
	if x.saddr {
		field = "ip saddr"
	}
	switch x.kind {
	case nfprotoV4:
		return "meta nfproto ipv4"
	case addrIn:
		return field + " " + x.prefixes[0].String()
	case addrNotIn:
		return field + " != { " + joinPrefixes(x.prefixes) + " }"
	case notReserved:
		return field + " != @reserved"
	case callerMember:
		return "ip daddr . meta mark @caller_member"
	case dports:
		ps := make([]string, len(x.ports))
		for i, p := range x.ports {
			ps[i] = fmt.Sprint(p.lo)
			if p.hi > p.lo {
				ps[i] += fmt.Sprintf("-%d", p.hi)
			}
		}
		return fmt.Sprintf("meta l4proto %s th dport { %s }", x.proto, strings.Join(ps, ", "))
	case localDst:
		return "fib daddr type local"
	}
	panic(fmt.Sprintf("network: match kind %d", x.kind))
}

// sameRules reports whether a and b are the same chain.
func sameRules(a, b []rule) bool {
	return slices.EqualFunc(a, b, func(x, y rule) bool { return x.String() == y.String() })
}

// mergeRanges sorts rs and merges the ranges that overlap or touch, so that nft, which
// merges them in its interval sets, keeps what is written.
func mergeRanges(rs []portRange) []portRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b portRange) int { return int(a.lo) - int(b.lo) })
	var out []portRange
	for _, r := range rs {
		if n := len(out); n > 0 && int(r.lo) <= int(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}
