package pki

import (
	"fmt"
	"net"
	"strings"
)

// Data-plane hosts. Every client trusts the one data-plane CA for every runner and checks
// only the host name (the gateway's ConnectSandbox hands out the CA and the runner's
// address), so a data-plane certificate for a host is the power to be that host's data
// plane to every organization. The control plane therefore certifies (and the gateway
// hands clients) a tenant organization's runner only under the name space its runner ID
// already owns, <runner_id>.<base-domain> (runner IDs are unique across organizations
// and hold no dot): DataPlaneHostOf. A platform runner is the operator's: its host is
// what the operator configured (--data-plane-host), any DNS name or IP.

// DefaultBaseDomain is the default base domain of runners' names (endpoints
// PORT-SANDBOX.RUNNER.DOMAIN, data-plane hosts under RUNNER.DOMAIN): *.localhost names
// resolve to loopback, so a platform on one machine needs no DNS.
const DefaultBaseDomain = "sandboxd.localhost"

// maxHostLen is the longest DNS name (RFC 1035, without the trailing dot).
const maxHostLen = 253

// TenantDataPlaneHost is the data-plane host a tenant organization's runner runnerID
// gets by default: <runnerID>.<domain>.
func TenantDataPlaneHost(runnerID, domain string) string { return runnerID + "." + domain }

// CheckTenantDataPlaneHost reports why host may not name the direct data plane of a
// tenant organization's runner runnerID under base domain domain (nil: it may). The host
// must be <runnerID>.<domain> or a name under it (LABEL.….<runnerID>.<domain>), spelt
// as certificates and TLS clients compare names: lowercase ASCII letters, digits and
// '-' in labels of 1-63 bytes, at most 253 bytes, no wildcard, no empty label (no
// trailing dot), not an IP address. Nothing is normalised: a name that would need it
// (upper case, a trailing dot, Unicode) is refused, not rewritten.
func CheckTenantDataPlaneHost(host, runnerID, domain string) error {
	want := TenantDataPlaneHost(runnerID, domain)
	switch {
	case runnerID == "" || strings.Contains(runnerID, ".") || !validDNSName(runnerID):
		return fmt.Errorf("runner ID %q cannot name a data-plane host", runnerID)
	case domain == "" || !validDNSName(domain):
		return fmt.Errorf("base domain %q is not a DNS name", domain)
	case host == "":
		return fmt.Errorf("is required: a tenant organization's runner serves its data plane at %s or a name under it", want)
	case net.ParseIP(host) != nil:
		return fmt.Errorf("%q is an IP address: a tenant organization's runner serves its data plane at %s or a name under it (only the platform's runners may use an IP)", host, want)
	case !validDNSName(host):
		return fmt.Errorf("%q is not a DNS name in lowercase ASCII letters, digits and '-' (no wildcard, no trailing dot)", host)
	case host != want && !strings.HasSuffix(host, "."+want):
		return fmt.Errorf("%q is not %s nor a name under it: a tenant organization's runner is certified only for names under its own runner ID", host, want)
	}
	return nil
}

// CheckBaseDomain reports why domain cannot be the base domain runners are named under
// (nil: it can): it must be a DNS name as validDNSName spells them.
func CheckBaseDomain(domain string) error {
	if !validDNSName(domain) {
		return fmt.Errorf("base domain %q is not a DNS name in lowercase ASCII letters, digits and '-' without a trailing dot", domain)
	}
	return nil
}

// validDNSName reports whether s is a DNS name of lowercase ASCII LDH labels (1-63 bytes,
// not starting or ending with '-'), at most 253 bytes, without a trailing dot.
func validDNSName(s string) bool {
	if len(s) == 0 || len(s) > maxHostLen {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
