package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/sni"
	"github.com/sandboxd/sandboxd/internal/splice"
)

const (
	defaultHandshakeTimeout = 10 * time.Second
	defaultMaxConnsPerSrc   = 512
	dialTimeout             = 10 * time.Second // resolving the name, and again connecting
	upstreamPort            = 443
)

// alertAccessDenied is a fatal TLS alert record access_denied(49): a refused client
// sees "remote error: tls: access denied", not a bare reset it might retry or misread.
var alertAccessDenied = []byte{21, 3, 3, 0, 2, 2, 49}

// Proxy accepts TLS connections redirected from sandboxes, reads the ClientHello's server
// name, and splices the connection to that name on port 443 when the source sandbox is
// granted it; otherwise closes it (after logging). It never decrypts. A connection
// without SNI, or with an IP literal as SNI, is refused: that is what makes an IP-only
// bypass fail.
//
// Set the fields before the first Serve and do not change them after.
type Proxy struct {
	// Grants returns the dns_name patterns granted to the sandbox at src (nil: none).
	Grants func(src netip.Addr) []string
	// Resolver resolves granted names (nil: net.DefaultResolver). The proxy dials the
	// addresses the name resolves to, never the packet's original destination (so a
	// granted SNI sent to an arbitrary IP reaches the real name, not that IP).
	Resolver *net.Resolver
	// Forbidden reports destinations never dialled even when a name resolves to them (the
	// caller passes the sandbox subnet besides). nil: the platform's reserved ranges
	// (reserved.Default: loopback, link-local/metadata, RFC 1918, CGNAT, multicast, …)
	// and the host's own addresses.
	Forbidden func(netip.Addr) bool
	// Dial connects to an upstream "ip:443" (nil: a net.Dialer with a 10 s timeout).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger // nil: slog.Default()
	// HandshakeTimeout bounds reading the ClientHello; 0 = 10 s.
	HandshakeTimeout time.Duration
	// Secrets returns the secrets to inject into the requests of the sandbox at src (nil:
	// none; inject.go). Connections to the hosts it names are intercepted (TLS terminated
	// with the sandbox's CA); all others are spliced, never decrypted.
	Secrets func(src netip.Addr) *SandboxSecrets
	// UpstreamRoots verifies the hosts of intercepted connections (nil: the system roots).
	UpstreamRoots *x509.CertPool
	// Audit records every use of an injected secret (nil: none).
	Audit *AuditLog
	// MaxConnsPerSource caps one sandbox's connections at once, so that one cannot
	// exhaust the host's file descriptors for all; 0 = 512. More are closed at once.
	MaxConnsPerSource int
	// Known, when set, reports whether src is a sandbox at all: a connection from any
	// other source is closed at once, before a byte of it is read (the Kubernetes
	// runner's proxy is reachable from the cluster's network, not only from sandboxes).
	// nil: every source is read (the local backend's proxy is reached only by DNAT).
	Known func(src netip.Addr) bool
	// MaxConns caps the connections of all sources together (0: none): one runner's proxy
	// serving a whole cluster's sandboxes (the Kubernetes backend) keeps its file
	// descriptors for its own work. More are closed at once.
	MaxConns int
	// Group, when set, names the tenant (organization) of the sandbox at src; the
	// connections of one group at once are capped at MaxConnsPerGroup (0: none), so
	// that one organization's sandboxes cannot take all MaxConns.
	Group            func(src netip.Addr) string
	MaxConnsPerGroup int

	mu        sync.Mutex
	stopping  bool // Shutdown or Close: no new connections
	closed    bool // Close: nothing new at all, not even an upstream for a connection being handled
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // both ends of every connection being handled
	perSource map[netip.Addr]int    // accepted connections being handled, by source
	perGroup  map[string]int        // Group: accepted connections being handled, by group
	groupOf   map[net.Conn]string   // Group: each accepted connection's group
	total     int                   // the sum of perSource
	ctx       context.Context       // cancelled by Close: ends resolving and dialling
	cancel    context.CancelFunc
	wg        sync.WaitGroup // one per connection being handled
}

// Serve accepts connections on l until l is closed (then it returns nil) or Close or
// Shutdown is called, and handles each in its own goroutine. Called after Close or
// Shutdown, it closes l and returns net.ErrClosed.
func (p *Proxy) Serve(l net.Listener) error {
	if !p.track(l) {
		_ = l.Close()
		return net.ErrClosed
	}
	defer p.untrack(l)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: wait rather than spin or give up.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log().Warn("egress proxy: accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("egress proxy: accept: %w", err)
		}
		backoff = 0
		src := addrOf(c.RemoteAddr())
		if p.Known != nil && (!src.IsValid() || !p.Known(src)) {
			counters.EgressDecision(counters.EgressDenied)
			p.log().Info("egress proxy: refused: the source is no sandbox", "src", src)
			_ = c.Close()
			continue
		}
		if err := p.admit(c, src); err != nil {
			counters.EgressDecision(counters.EgressLimited)
			p.log().Info("egress proxy: refused: "+err.Error(), "src", src)
			_ = c.Close()
			continue
		}
		go p.handle(c, src)
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// Close stops every Serve and closes every connection, also those being spliced.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.stopping, p.closed = true, true
	if p.cancel != nil {
		p.cancel()
	}
	for l := range p.listeners {
		_ = l.Close()
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Shutdown stops every Serve, lets the connections being handled finish until ctx is
// done, then closes what is left (returning ctx's error).
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.stopping = true
	for l := range p.listeners {
		_ = l.Close()
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		_ = p.Close()
		return ctx.Err()
	}
}

func (p *Proxy) track(l net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return false
	}
	if p.listeners == nil {
		p.listeners = make(map[net.Listener]struct{})
	}
	p.listeners[l] = struct{}{}
	return true
}

func (p *Proxy) untrack(l net.Listener) {
	p.mu.Lock()
	delete(p.listeners, l)
	p.mu.Unlock()
}

// admit tracks an accepted connection from src and counts it in wg (under mu, so that
// no Add races with the Wait of a Close or Shutdown that has set stopping).
func (p *Proxy) admit(c net.Conn, src netip.Addr) error {
	limit := p.MaxConnsPerSource
	if limit <= 0 {
		limit = defaultMaxConnsPerSrc
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return net.ErrClosed
	}
	if p.perSource[src] >= limit {
		return fmt.Errorf("%d connections from this source already", limit)
	}
	if p.MaxConns > 0 && p.total >= p.MaxConns {
		return fmt.Errorf("%d connections in all already", p.MaxConns)
	}
	if p.Group != nil && p.MaxConnsPerGroup > 0 {
		grp := p.Group(src)
		if p.perGroup[grp] >= p.MaxConnsPerGroup {
			return fmt.Errorf("%d connections of this source's organization already", p.MaxConnsPerGroup)
		}
		if p.perGroup == nil {
			p.perGroup, p.groupOf = make(map[string]int), make(map[net.Conn]string)
		}
		p.perGroup[grp]++
		p.groupOf[c] = grp
	}
	p.total++
	if p.perSource == nil {
		p.perSource = make(map[netip.Addr]int)
	}
	p.perSource[src]++
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancel(context.Background())
	}
	p.addLocked(c)
	p.wg.Add(1)
	return nil
}

// done undoes admit.
func (p *Proxy) done(c net.Conn, src netip.Addr) {
	p.remove(c)
	p.mu.Lock()
	p.total--
	if p.perSource[src]--; p.perSource[src] <= 0 {
		delete(p.perSource, src)
	}
	if grp, ok := p.groupOf[c]; ok {
		delete(p.groupOf, c)
		if p.perGroup[grp]--; p.perGroup[grp] <= 0 {
			delete(p.perGroup, grp)
		}
	}
	p.mu.Unlock()
	p.wg.Done()
}

// add tracks an upstream connection, so that Close reaches it.
func (p *Proxy) add(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.addLocked(c)
	return true
}

func (p *Proxy) addLocked(c net.Conn) {
	if p.conns == nil {
		p.conns = make(map[net.Conn]struct{})
	}
	p.conns[c] = struct{}{}
}

func (p *Proxy) remove(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.Default()
}

// refusal says why a connection for server name must not be spliced when its source is
// granted patterns; "" when it may be.
func refusal(name string, patterns []string) string {
	if name == "" {
		return "no server name (SNI)"
	}
	if isIPLike(name) {
		return "server name is an IP address"
	}
	for _, pat := range patterns {
		if MatchName(pat, name) {
			return ""
		}
	}
	return "server name not granted"
}

// isIPLike: an IP literal, or a name whose last label is all digits, which some
// resolvers read as an IPv4 address ("10.1") and no grant can name (see ValidPattern).
func isIPLike(name string) bool {
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	last := name[strings.LastIndexByte(name, '.')+1:]
	return strings.Trim(last, "0123456789") == ""
}

func (p *Proxy) handle(c net.Conn, src netip.Addr) {
	defer p.done(c, src)
	timeout := p.HandshakeTimeout
	if timeout <= 0 {
		timeout = defaultHandshakeTimeout
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	hello, name, err := sni.Read(c)
	if err != nil {
		// Every refusal is logged: a sandbox owner debugging "connection reset" needs it.
		counters.EgressDecision(counters.EgressDenied)
		p.log().Info("egress proxy: refused: no TLS ClientHello", "src", src, "err", err)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var patterns []string
	if p.Grants != nil && src.IsValid() {
		patterns = p.Grants(src)
	}
	if why := refusal(name, patterns); why != "" {
		counters.EgressDecision(counters.EgressDenied)
		p.log().Info("egress proxy: refused: "+why, "src", src, "sni", name)
		p.deny(c)
		return
	}
	p.mu.Lock()
	ctx := p.ctx // set by admit
	p.mu.Unlock()
	if p.Secrets != nil {
		if ss := p.Secrets(src); ss.intercepts(strings.ToLower(name)) {
			counters.EgressDecision(counters.EgressIntercepted)
			p.intercept(ctx, c, hello, strings.ToLower(name), src, ss)
			return
		}
	}
	up, err := p.connect(ctx, name)
	if err != nil {
		p.log().Info("egress proxy: refused: "+err.Error(), "src", src, "sni", name)
		if errors.Is(err, errForbidden) {
			counters.EgressDecision(counters.EgressDenied)
			p.deny(c)
		} else {
			counters.EgressDecision(counters.EgressError)
		}
		return
	}
	counters.EgressDecision(counters.EgressAllowed)
	if !p.add(up) {
		_ = up.Close()
		return
	}
	defer p.remove(up)
	// The hello goes to the upstream unchanged: it is the client's TLS handshake.
	if _, err := up.Write(hello); err != nil {
		p.log().Info("egress proxy: write ClientHello", "src", src, "sni", name, "upstream", up.RemoteAddr(), "err", err)
		return
	}
	p.log().Debug("egress proxy: spliced", "src", src, "sni", name, "upstream", up.RemoteAddr())
	splice.Join(c, up)
}

// deny sends the access_denied alert, not waiting long for a client that does not read.
func (p *Proxy) deny(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(alertAccessDenied)
}

var errForbidden = errors.New("name resolves only to forbidden addresses")

// connect resolves name and connects to the first address that is not forbidden and
// answers.
func (p *Proxy) connect(ctx context.Context, name string) (net.Conn, error) {
	r := p.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	rctx, cancel := context.WithTimeout(ctx, dialTimeout)
	// The trailing dot makes the name absolute: no resolv.conf search domain is tried.
	addrs, err := r.LookupNetIP(rctx, "ip", name+".")
	cancel()
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	forbidden := p.Forbidden
	if forbidden == nil {
		forbidden = defaultForbidden
	}
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: dialTimeout}).DialContext
	}
	var allowed, refused []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); forbidden(a) {
			refused = append(refused, a)
		} else {
			allowed = append(allowed, a)
		}
	}
	if len(allowed) == 0 {
		if len(refused) == 0 {
			return nil, fmt.Errorf("resolve: no addresses for %s", name)
		}
		return nil, fmt.Errorf("%w %v", errForbidden, refused)
	}
	ctx, cancel = context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var errs []error
	for _, a := range allowed {
		up, err := dial(ctx, "tcp", netip.AddrPortFrom(a, upstreamPort).String())
		if err == nil {
			return up, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connect: %w", errors.Join(errs...))
}

// defaultForbidden is the platform's reserved list (the one the runners' rules use).
func defaultForbidden(a netip.Addr) bool { return reservedAddrs.Contains(a) || reserved.IsHostAddr(a) }

// ForbiddenWith is the default Forbidden (the platform's reserved ranges and the host's
// addresses) and also every address in extra: a deployment's own ranges the proxy must
// never dial for a sandbox (a Kubernetes cluster's Service and Pod ranges when they are
// not private, the proxy's own addresses).
func ForbiddenWith(extra ...netip.Prefix) func(netip.Addr) bool {
	set := reserved.NewSet(extra...)
	return func(a netip.Addr) bool {
		a = a.Unmap()
		return defaultForbidden(a) || set.Contains(a)
	}
}

var reservedAddrs = reserved.Default()

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
