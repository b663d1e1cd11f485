package edge

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Kind is how the edge treats a route's connections. The zero Kind is invalid.
type Kind uint8

const (
	// KindHTTPS ends TLS at the edge and proxies HTTP to the sandbox.
	KindHTTPS Kind = iota + 1
	// KindPassthrough splices the still-encrypted TCP connection to the sandbox.
	KindPassthrough
)

func (k Kind) String() string {
	switch k {
	case KindHTTPS:
		return "HTTPS"
	case KindPassthrough:
		return "TLS_PASSTHROUGH"
	default:
		return fmt.Sprintf("Kind(%d)", uint8(k))
	}
}

// Auth is who may use an HTTPS route. The zero Auth is AuthOpen.
type Auth uint8

const (
	// AuthOpen lets every request through.
	AuthOpen Auth = iota
	// AuthToken (the wire's SHARE_TOKEN) needs the sandbox's share token when the route
	// has a ShareTokenHash (sharetoken.go), or a bearer key that Config.Authorize
	// accepts for the route's org.
	AuthToken
)

func (a Auth) String() string {
	switch a {
	case AuthOpen:
		return "OPEN"
	case AuthToken:
		return "TOKEN"
	default:
		return fmt.Sprintf("Auth(%d)", uint8(a))
	}
}

const (
	// DefaultTimeout is an HTTPS route's request timeout when Route.Timeout is 0.
	DefaultTimeout = 15 * time.Second
	// MinTimeout and MaxTimeout bound a non-zero Route.Timeout.
	MinTimeout = 15 * time.Second
	MaxTimeout = 900 * time.Second
)

// Route is one public endpoint: a sandbox's port and where the edge reaches it.
type Route struct {
	SandboxID string
	Org       string // the sandbox's organization, handed to Config.Authorize
	Port      int    // the sandbox port in the public name
	Kind      Kind
	Auth      Auth          // HTTPS only
	Timeout   time.Duration // HTTPS only: time to response headers; 0 = DefaultTimeout
	Backend   netip.AddrPort
	// ShareTokenHash (AuthToken only) is ShareTokenHash of the sandbox's share token;
	// "": API keys only.
	ShareTokenHash string
}

// Validate checks r the way the target system checks an EndpointSpec.
func (r Route) Validate() error {
	var errs []error
	if !validSandboxID(r.SandboxID) {
		errs = append(errs, fmt.Errorf("sandbox ID %q is not %d characters of a-z, 2-7", r.SandboxID, sandboxIDLen))
	}
	if r.Port < 1 || r.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d is not in 1-65535", r.Port))
	}
	if !r.Backend.IsValid() || r.Backend.Port() == 0 {
		errs = append(errs, fmt.Errorf("backend %v is not an address and port", r.Backend))
	}
	switch r.Kind {
	case KindHTTPS:
		if r.Auth != AuthOpen && r.Auth != AuthToken {
			errs = append(errs, fmt.Errorf("unknown auth %v", r.Auth))
		}
		if r.Timeout != 0 && (r.Timeout < MinTimeout || r.Timeout > MaxTimeout) {
			errs = append(errs, fmt.Errorf("request timeout %v is not 0 or %v-%v", r.Timeout, MinTimeout, MaxTimeout))
		}
		if r.ShareTokenHash != "" && (r.Auth != AuthToken || !ValidShareTokenHash(r.ShareTokenHash)) {
			errs = append(errs, errors.New("a share token hash needs token auth and 64 lowercase hex digits"))
		}
	case KindPassthrough:
		if r.Auth != AuthOpen {
			errs = append(errs, errors.New("a passthrough route cannot have auth"))
		}
		if r.Timeout != 0 {
			errs = append(errs, errors.New("a passthrough route cannot have a request timeout"))
		}
		if r.ShareTokenHash != "" {
			errs = append(errs, errors.New("a passthrough route cannot have a share token"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown kind %v", r.Kind))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("edge: route %d-%s: %w", r.Port, r.SandboxID, err)
	}
	return nil
}

func (r Route) timeout() time.Duration {
	if r.Timeout == 0 {
		return DefaultTimeout
	}
	return r.Timeout
}

// Routes finds the route of a sandbox port. Lookup runs on every connection and
// request, so it must be fast and safe for concurrent use.
type Routes interface {
	Lookup(sandboxID string, port int) (Route, bool)
}
