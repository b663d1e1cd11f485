package image

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// errPlainHTTP is returned by the transport guard for a plain-HTTP request to a
// host that is not configured as insecure.
type errPlainHTTP struct{ host string }

func (e *errPlainHTTP) Error() string {
	return fmt.Sprintf("plain HTTP to %s refused: the registry is not configured as insecure", e.host)
}

// guardTransport refuses plain-HTTP requests to hosts not listed as insecure.
// go-containerregistry itself falls back to HTTP for loopback/RFC1918 hosts; we do not.
type guardTransport struct {
	base     http.RoundTripper
	insecure func(host string) bool
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" && !g.insecure(req.URL.Host) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &errPlainHTTP{host: req.URL.Host}
	}
	return g.base.RoundTrip(req)
}

// mapErr classifies a registry error into one of the package's sentinel errors,
// keeping the original error in the chain.
func mapErr(r name.Reference, err error) error {
	if err == nil {
		return nil
	}
	ref := r.Name()
	host := r.Context().RegistryStr()
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrUnreachable) ||
		errors.Is(err, ErrInvalidReference) || errors.Is(err, ErrUnsafeLayer) || errors.Is(err, ErrRegistryNotAllowed) {
		return err
	}
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: %s: %w", ErrNotFound, ref, err)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("%w: %s: %w", ErrUnauthorized, ref, err)
			case transport.NameInvalidErrorCode, transport.TagInvalidErrorCode:
				return fmt.Errorf("%w: %s: %w", ErrInvalidReference, ref, err)
			}
		}
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%w: %s: %w", ErrNotFound, ref, err)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %s: %w", ErrUnauthorized, ref, err)
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return fmt.Errorf("%w: %s: %w", ErrUnreachable, host, err)
		}
		return fmt.Errorf("registry %s: %s: %w", host, ref, err)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var ph *errPlainHTTP
	if errors.As(err, &ph) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return fmt.Errorf("%w: %s speaks plain HTTP but is not configured as an insecure registry (HTTPS required): %w", ErrUnreachable, host, err)
	}
	var (
		opErr   *net.OpError
		dnsErr  *net.DNSError
		netErr  net.Error
		certErr *tls.CertificateVerificationError
		hostErr x509.HostnameError
		uaErr   x509.UnknownAuthorityError
		recErr  tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &dnsErr):
		return fmt.Errorf("%w: %s: DNS: %w", ErrUnreachable, host, err)
	case errors.As(err, &certErr), errors.As(err, &hostErr), errors.As(err, &uaErr), errors.As(err, &recErr):
		return fmt.Errorf("%w: %s: TLS: %w", ErrUnreachable, host, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, host, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: timeout: %w", ErrUnreachable, host, err)
	case errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Errorf("%w: %s: timeout: %w", ErrUnreachable, host, err)
	case errors.As(err, &opErr):
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, host, err)
	case strings.Contains(err.Error(), "tls: "), strings.Contains(err.Error(), "x509: "):
		return fmt.Errorf("%w: %s: TLS: %w", ErrUnreachable, host, err)
	}
	return fmt.Errorf("%s: %w", ref, err)
}
