package gateway

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
)

// The caller's source address, for the runners' source-IP allowlists
// (control_plane_access.source_ip_allowlist; docs/policy.md "Source-IP allowlist").
//
// The address is the TCP peer of the request, unless the peer is inside one of the
// configured trusted proxies (Config.TrustedProxies, --trusted-proxies; none by default).
// Then X-Forwarded-For is read right to left (all its header lines joined, in order):
// entries inside a trusted proxy are skipped, and the first entry that is not is the
// caller. When every entry is a trusted proxy, the left-most one is the caller (the
// request came from a proxy itself); without the header, the peer. An entry that is not
// a bare IP address (or an IP:port, or [IPv6]:port) makes the caller unknown, and so
// does a chain longer than maxForwardedHops: an unknown caller is refused by every
// allowlist. Only a trusted peer's header is read, so a client that sends
// X-Forwarded-For itself directly (or through an untrusted hop) is still judged by its
// own address; and since a trusted proxy appends the address it saw, entries a client
// wrote to the left of it are never reached. Forwarded (RFC 7239) is not read.

// maxForwardedHops bounds the X-Forwarded-For entries examined.
const maxForwardedHops = 32

// callerKey holds the caller's address in a request's context (withCaller).
type callerKey struct{}

// caller is a public request's source address; addr is invalid when unknown.
type caller struct{ addr netip.Addr }

// withCaller records every request's source address (sourceAddr) in its context.
func withCaller(trusted []netip.Prefix, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := caller{addr: sourceAddr(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// callerOf returns the source address of the public request ctx serves; ok is false
// for the gateway's own work (reconciliation, warm pools), which no allowlist limits.
func callerOf(ctx context.Context) (netip.Addr, bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c.addr, ok
}

// sourceAddr is the caller's address by the rule above: remote is the TCP peer
// (host:port), xff the X-Forwarded-For header lines.
func sourceAddr(remote string, xff []string, trusted []netip.Prefix) netip.Addr {
	peer := parseHop(remote)
	if !peer.IsValid() || !inAny(trusted, peer) || len(xff) == 0 {
		return peer
	}
	var hops []string
	for _, line := range xff {
		for h := range strings.SplitSeq(line, ",") {
			hops = append(hops, h)
			if len(hops) > maxForwardedHops {
				return netip.Addr{}
			}
		}
	}
	last := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHop(strings.TrimSpace(hops[i]))
		if !a.IsValid() {
			return netip.Addr{}
		}
		if !inAny(trusted, a) {
			return a
		}
		last = a
	}
	return last
}

// parseHop parses "IP", "IP:port" or "[IPv6]:port" (no zone); invalid otherwise.
func parseHop(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}
		}
		return a.Unmap()
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}
	}
	return a.Unmap()
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies parses --trusted-proxies: comma-separated CIDRs or addresses
// (a single address is a /32 or /128); "" is none.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil || a.Zone() != "" {
				return nil, &net.ParseError{Type: "CIDR or IP address", Text: f}
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 {
				return nil, &net.ParseError{Type: "CIDR or IP address (write IPv4 prefixes in IPv4 form)", Text: f}
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// checkSource refuses a public call on a sandbox of runner id when the runner's
// current policy does not allow the caller's address: PERMISSION_DENIED
// CWSANDBOX_SOURCE_IP_NOT_ALLOWED naming the address seen. A policy that cannot be read
// refuses the call (UNAVAILABLE), as it would refuse a create.
func (s *Server) checkSource(ctx context.Context, id string) error {
	addr, public := callerOf(ctx)
	if !public {
		return nil
	}
	for i, r := range s.runners {
		if r.ID() != id {
			continue
		}
		p, _, err := s.views.policyOf(ctx, i, id)
		if err != nil {
			return apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable, "%v", err), placement.RetryAfter)
		}
		if !policy.SourceAllowed(p, addr) {
			return SourceNotAllowed(id, addr)
		}
		return nil
	}
	return nil
}

// SourceNotAllowed is the error of a call from addr that runner id's allowlist refuses.
func SourceNotAllowed(runnerID string, addr netip.Addr) error {
	a := policy.AddrString(addr)
	return apierr.New(apierr.SourceIPNotAllowed,
		"calls from "+a+" are not allowed on the sandboxes of runner "+runnerID+" (its policy's "+policy.ConstraintSourceIPAllowlist+")",
		map[string]string{"source_ip": a, "runner_id": runnerID})
}
