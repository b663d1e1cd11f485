package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/sandboxd/sandboxd/internal/reserved"
)

// ErrRegistryNotAllowed: the reference names (or its registry's name resolves to) an
// address the puller never dials for a registry the operator did not configure:
// loopback, link-local and cloud metadata, this host's own addresses, the sandbox
// network (Options.Forbidden). Without it, an image reference would be a way to probe
// the host's ports.
var ErrRegistryNotAllowed = errors.New("registry not allowed")

// defaultForbidden: host-local addresses (loopback, link-local, unspecified, multicast)
// and the host's own.
func defaultForbidden(a netip.Addr) bool { return reserved.HostLocal(a) || reserved.IsHostAddr(a) }

// configured reports whether the operator named registry host[:port] (as a reference
// writes it) in the store's options: an insecure pattern, credentials, a mirrored
// registry or a mirror.
func (s *Store) configured(hostport string) bool {
	hostport = strings.ToLower(hostport)
	if s.isInsecure(hostport) {
		return true
	}
	for h := range s.opts.Auth {
		if strings.EqualFold(h, hostport) {
			return true
		}
	}
	for reg, ms := range s.opts.Mirrors {
		if strings.EqualFold(reg, hostport) {
			return true
		}
		for _, m := range ms {
			if strings.EqualFold(m.Host, hostport) {
				return true
			}
		}
	}
	return false
}

// checkRegistry refuses, before any dial, a reference whose registry is an address
// literal the store must not dial, or a localhost name, unless it is configured.
func (s *Store) checkRegistry(r name.Reference) error {
	hostport := r.Context().RegistryStr()
	if s.configured(hostport) {
		return nil
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	lh := strings.ToLower(host)
	if lh == "localhost" || strings.HasSuffix(lh, ".localhost") {
		return fmt.Errorf("%w: %s: a loopback name", ErrRegistryNotAllowed, r.Name())
	}
	if a, err := netip.ParseAddr(host); err == nil && s.forbidden(a.WithZone("")) {
		return fmt.Errorf("%w: %s: the address is loopback, link-local, this host's or the sandbox network's", ErrRegistryNotAllowed, r.Name())
	}
	return nil
}

func (s *Store) forbidden(a netip.Addr) bool {
	a = a.Unmap()
	if s.opts.Forbidden != nil {
		return s.opts.Forbidden(a) || reserved.HostLocal(a)
	}
	return defaultForbidden(a)
}

// guardDial wraps dial so that a registry the operator did not configure is reached
// only at addresses that are not forbidden. With resolve, the name is resolved here
// (Options.LookupIP) and only allowed addresses are dialled (a name that resolves to
// 127.0.0.1 is refused like the literal, before any packet); without (a caller's own
// transport, which resolves itself), the connected address is checked and the
// connection dropped before any request is sent.
func (s *Store) guardDial(dial func(ctx context.Context, network, addr string) (net.Conn, error), resolve bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if s.configured(addr) || s.configured(strings.TrimSuffix(addr, ":443")) || s.configured(strings.TrimSuffix(addr, ":80")) ||
			s.proxies[strings.ToLower(addr)] {
			return dial(context.WithValue(ctx, configuredKey{}, true), network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var ips []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{a}
		} else if !resolve {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err != nil || s.forbidden(ap.Addr()) {
				_ = c.Close()
				return nil, fmt.Errorf("%w: %s resolves to %s", ErrRegistryNotAllowed, host, c.RemoteAddr())
			}
			return c, nil
		} else {
			lookup := s.opts.LookupIP
			if lookup == nil {
				lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
					return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
				}
			}
			if ips, err = lookup(ctx, host); err != nil {
				return nil, err
			}
		}
		var errs []error
		for _, a := range ips {
			if s.forbidden(a) {
				errs = append(errs, fmt.Errorf("%w: %s resolves to %s", ErrRegistryNotAllowed, host, a))
				continue
			}
			c, err := dial(ctx, network, net.JoinHostPort(a.String(), port))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
		return nil, errors.Join(errs...)
	}
}

type configuredKey struct{}

// guardControl is a net.Dialer ControlContext hook refusing forbidden addresses at
// connect time, on the address actually connected to, unless guardDial marked the
// dial as one to a configured registry.
func (s *Store) guardControl(ctx context.Context, network, address string, _ syscall.RawConn) error {
	if ctx.Value(configuredKey{}) != nil {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil || s.forbidden(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrRegistryNotAllowed, address)
	}
	return nil
}

// guardedBase returns base with its dials guarded: an *http.Transport is cloned with a
// guarded DialContext (the default one also re-checks at connect); any other
// RoundTripper is used as it is.
func (s *Store) guardedBase(base http.RoundTripper) http.RoundTripper {
	t, ok := base.(*http.Transport)
	if !ok {
		return base
	}
	t = t.Clone()
	dial, own := t.DialContext, s.opts.Transport != nil && t.DialContext != nil
	if !own {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, ControlContext: s.guardControl}).DialContext
	}
	t.DialContext = s.guardDial(dial, !own || s.opts.LookupIP != nil)
	return t
}

// proxyHosts are the host:port of the HTTP(S) proxies the environment names: dials to
// them are the operator's configuration.
func proxyHosts() map[string]bool {
	out := map[string]bool{}
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		v := os.Getenv(k)
		if v == "" {
			continue
		}
		if !strings.Contains(v, "://") {
			v = "http://" + v
		}
		if u, err := url.Parse(v); err == nil && u.Host != "" {
			h := u.Host
			if u.Port() == "" {
				h = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
			}
			out[strings.ToLower(h)] = true
		}
	}
	return out
}

// Guard is the registry guard for a puller outside a Store (the Kubernetes backend reads
// image configs from the runner's own network): the same refusals, with nothing
// configured by the operator but the environment's proxies.
type Guard struct{ s *Store }

// NewGuard returns a Guard.
func NewGuard() *Guard { return &Guard{s: &Store{proxies: proxyHosts()}} }

// Check refuses, before any dial, a reference whose registry is a loopback name or a
// loopback, link-local, unspecified, multicast or this host's address.
func (g *Guard) Check(r name.Reference) error { return g.s.checkRegistry(r) }

// Transport is base (an *http.Transport) with its dials guarded: names are resolved and
// only allowed addresses dialled, and the connected address is checked again.
func (g *Guard) Transport(base http.RoundTripper) http.RoundTripper { return g.s.guardedBase(base) }
