package edge

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
)

// DefaultCertTTL is the lifetime of a wildcard certificate WildcardCertificate issues;
// it is renewed at half-life.
const DefaultCertTTL = 7 * 24 * time.Hour

// WildcardCertificate returns a tls.Config.GetCertificate serving *.<runnerID>.<baseDomain>
// issued by ca, valid for ttl (0: DefaultCertTTL) and reissued once half of it is over.
// The first certificate is issued now, so a CA that cannot issue fails here.
func WildcardCertificate(ca *pki.CA, runnerID, baseDomain string, ttl time.Duration) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	if ca == nil || runnerID == "" || baseDomain == "" {
		return nil, fmt.Errorf("edge: wildcard certificate needs a CA, a runner ID and a base domain")
	}
	if ttl == 0 {
		ttl = DefaultCertTTL
	}
	name := "*." + strings.ToLower(runnerID) + "." + strings.ToLower(baseDomain)
	get := pki.Renewing(func() (tls.Certificate, error) {
		return ca.IssueServer(name, []string{name}, nil, ttl)
	})
	if _, err := get(); err != nil {
		return nil, fmt.Errorf("edge: issue certificate for %s: %w", name, err)
	}
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }, nil
}
