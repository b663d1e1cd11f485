package pki

import (
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// SplitHosts sorts host names and addresses for a certificate: IPs into IP SANs, the
// rest (non-empty) into DNS SANs after dns.
func SplitHosts(dns []string, hosts []string) ([]string, []net.IP) {
	var ips []net.IP
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	return dns, ips
}

// Renewing hands out a certificate from issue, issuing a new one once half of its life
// is over. If issuing fails while the current one is still valid, that one is served and
// the next call tries again. Safe for concurrent use (handshakes).
func Renewing(issue func() (tls.Certificate, error)) func() (*tls.Certificate, error) {
	var (
		mu      sync.Mutex
		cur     *tls.Certificate
		renewAt time.Time
	)
	return func() (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		if cur != nil && time.Now().Before(renewAt) {
			return cur, nil
		}
		c, err := issue()
		if err != nil {
			if cur != nil && time.Now().Before(cur.Leaf.NotAfter) {
				return cur, nil
			}
			return nil, err
		}
		cur = &c
		renewAt = c.Leaf.NotBefore.Add(c.Leaf.NotAfter.Sub(c.Leaf.NotBefore) / 2)
		return cur, nil
	}
}
