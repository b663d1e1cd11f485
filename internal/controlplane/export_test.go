package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/url"

	"github.com/sandboxd/sandboxd/internal/store"
)

// MaintenanceProto is maintenanceProto, for the fuzz test's round trip.
var MaintenanceProto = maintenanceProto

// WithRunnerCert is ctx carrying a verified client certificate of runner id of org, as
// the TLS listener (withTLSState) gives a runner's call.
func WithRunnerCert(ctx context.Context, org, id string) context.Context {
	cert := &x509.Certificate{URIs: []*url.URL{RunnerURI(org, id)}}
	return context.WithValue(ctx, tlsStateKey{}, &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}})
}

// BeginInstall starts r's install as CreateManagedRunner does (for a runner a test put
// into the store directly).
func (s *Service) BeginInstall(ctx context.Context, r store.Runner) error {
	_, err := s.beginInstall(ctx, r)
	return err
}

// AdminFront is the admin services' front (apifront), which serves every path the TLS
// listener does not route elsewhere: what a control plane from before the store proof
// answered on StoreProofPath.
func (s *Service) AdminFront() http.Handler { return s.adminFront() }
