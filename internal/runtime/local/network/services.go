//go:build linux

package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/reserved"
)

// The platform's servers on the gateway address: the DNS every sandbox's resolv.conf
// names (the input chain lets UDP and TCP 53 through from the bridge, whatever a
// sandbox's egress rules), and the SNI proxy dns_name grants redirect TCP 443 to.
// internal/egress implements both; the Manager owns their sockets, so they live and die
// with it.

// DNSServer answers DNS queries (egress.DNS).
type DNSServer interface {
	ServeUDP(pc net.PacketConn) error
	ServeTCP(l net.Listener) error
}

// ProxyServer serves redirected TLS connections (egress.Proxy).
type ProxyServer interface {
	Serve(l net.Listener) error
}

type services struct {
	closers []func() error
	wg      sync.WaitGroup
}

// StartServices listens on the gateway (DNS on port 53, UDP and TCP; the proxy on
// Config.ProxyPort) and serves dns and proxy (either may be nil) until Close. It fails
// if they were started already.
func (m *Manager) StartServices(dns DNSServer, proxy ProxyServer) (err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.svc != nil {
		return errors.New("network: services already started")
	}
	s := &services{}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	gw := m.gateway.String()
	serve := func(fn func() error) {
		s.wg.Go(func() {
			// A server ends when its socket is closed (stop); nothing to report then.
			_ = fn()
		})
	}
	// Servers that can close their connections too (internal/egress's) are closed first.
	for _, srv := range []any{dns, proxy} {
		if c, ok := srv.(io.Closer); ok && srv != nil {
			s.closers = append(s.closers, c.Close)
		}
	}
	if dns != nil {
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(gw, "53"))
		if err != nil {
			return fmt.Errorf("network: platform DNS: %w", err)
		}
		s.closers = append(s.closers, pc.Close)
		l, err := net.Listen("tcp4", net.JoinHostPort(gw, "53"))
		if err != nil {
			return fmt.Errorf("network: platform DNS: %w", err)
		}
		s.closers = append(s.closers, l.Close)
		serve(func() error { return dns.ServeUDP(pc) })
		serve(func() error { return dns.ServeTCP(l) })
	}
	if proxy != nil {
		if m.cfg.ProxyPort == 0 {
			return errors.New("network: egress proxy: no Config.ProxyPort")
		}
		l, err := net.Listen("tcp4", net.JoinHostPort(gw, strconv.Itoa(m.cfg.ProxyPort)))
		if err != nil {
			return fmt.Errorf("network: egress proxy: %w", err)
		}
		s.closers = append(s.closers, l.Close)
		serve(func() error { return proxy.Serve(l) })
	}
	m.svc = s
	return nil
}

// StartEgress serves internal/egress's DNS forwarder (to Config.Nameservers) and, with
// a Config.ProxyPort, its SNI proxy for dns_name grants (Grants, Forbidden, Resolver).
func (m *Manager) StartEgress(log *slog.Logger) error {
	ups := make([]string, len(m.nameservers))
	for i, ns := range m.nameservers {
		ups[i] = withPort53(ns)
	}
	var proxy ProxyServer
	if m.cfg.ProxyPort != 0 {
		roots, err := m.upstreamRoots()
		if err != nil {
			return err
		}
		proxy = &egress.Proxy{Grants: m.Grants, Resolver: m.Resolver(), Forbidden: m.Forbidden, Log: log,
			Secrets: m.Secrets, UpstreamRoots: roots, Audit: m.auditLog()}
	}
	return m.StartServices(&egress.DNS{Upstreams: ups, Log: log}, proxy)
}

// StopServices stops what StartServices started (Close does too); sandbox networks and
// their rules stay.
func (m *Manager) StopServices() {
	m.mu.Lock()
	s := m.svc
	m.svc = nil
	m.mu.Unlock()
	if s != nil {
		s.stop()
	}
}

// stop closes the servers' sockets and waits for them to return.
func (s *services) stop() {
	for _, c := range s.closers {
		_ = c()
	}
	s.wg.Wait()
}

// Resolver resolves with the platform DNS's upstreams (Config.Nameservers), so the
// proxy sees the names the sandboxes see; nil (the host's resolver) when there are none.
func (m *Manager) Resolver() *net.Resolver {
	if len(m.nameservers) == 0 {
		return nil
	}
	ups := append([]string(nil), m.nameservers...)
	var next int
	var mu sync.Mutex
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		mu.Lock()
		up := ups[next%len(ups)]
		next++
		mu.Unlock()
		d := net.Dialer{Timeout: 2 * time.Second}
		return d.DialContext(ctx, network, withPort53(up))
	}}
}

func withPort53(s string) string {
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s
	}
	return net.JoinHostPort(s, "53")
}

// Forbidden reports whether the egress proxy must not connect to a: the host itself
// (any of its addresses), the sandboxes, and every reserved range (reserved.Default:
// loopback, link-local and cloud metadata, RFC 1918, CGNAT, multicast, …, also those the
// operator opened to cidr rules): a dns_name grant must not become a way around the
// egress rules by a name that resolves to an internal address.
func (m *Manager) Forbidden(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() {
		return true // sandboxes have no IPv6 (nor does the proxy dial it for them)
	}
	return forbidden.Contains(a) || m.cfg.Subnet.Contains(a) || reserved.IsHostAddr(a)
}

var forbidden = reserved.Default()
