package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/sockmark"
)

// Config configures an Edge. RunnerID, BaseDomain, Routes and GetCertificate are required.
type Config struct {
	RunnerID   string // names are <port>-<sandbox-id>.<RunnerID>.<BaseDomain>
	BaseDomain string
	Routes     Routes
	// GetCertificate serves the wildcard certificate *.<RunnerID>.<BaseDomain> for
	// terminated connections; see WildcardCertificate.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Authorize accepts a bearer key for a sandbox of org (AuthToken routes): nil if the
	// key may use the sandbox, an error wrapping ErrUnauthenticated if it is no valid key
	// (401), any other error if it may not (403). Nil: every AuthToken request is refused.
	Authorize func(ctx context.Context, token, org string) error
	// KeyActive says whether the API key of ID keyID is still active for org (nil: it
	// is); asked for every request on a browser login session (cached for
	// sessionKeyCacheTTL), so that revoking a key ends its sessions. Nil: sessions last
	// until they expire.
	KeyActive func(ctx context.Context, keyID, org string) error
	// SessionKey signs the session cookies of TOKEN endpoints' browser logins (see
	// login.go); nil: a random key, so sessions end with the process.
	SessionKey []byte
	// SessionTTL is how long a browser login lasts; 0: DefaultSessionTTL.
	SessionTTL time.Duration
	Logger     *slog.Logger // nil: slog.Default()

	MaxConns         int           // open connections at once; 0: 10000
	HandshakeTimeout time.Duration // to read the ClientHello, and again to finish TLS; 0: 10 s
	IdleTimeout      time.Duration // keep-alive connection without a request; 0: 2 min
	DialTimeout      time.Duration // to connect to a sandbox port; 0: 5 s
	// DialMark is the socket mark (SO_MARK, Linux) of connections to sandbox ports: the
	// local network's host mark, without which its guard refuses host connections into
	// the sandbox bridge (network.Manager.HostMark). 0: unmarked (Kubernetes runners).
	DialMark uint32
	// Wake, when set, is called for every request and passthrough connection the edge
	// admitted, before it connects to the sandbox: the runner counts the sandbox busy
	// until done is called (at the request's or connection's end) and resumes a paused
	// sandbox first. An error: the sandbox cannot serve it now (503, or the connection
	// is closed). See runner.Runner.Wake.
	Wake func(ctx context.Context, sandboxID string) (done func(), err error)
}

const (
	defaultMaxConns         = 10000
	defaultHandshakeTimeout = 10 * time.Second
	defaultIdleTimeout      = 2 * time.Minute
	defaultDialTimeout      = 5 * time.Second
)

// Edge routes TLS connections to sandbox ports; see the package documentation.
type Edge struct {
	cfg      Config
	log      *slog.Logger
	tls      *tls.Config
	srv      *http.Server // serves the terminated connections that q hands over
	q        *queue
	proxies  sync.Map    // request timeout → *httputil.ReverseProxy
	backends backendPool // the HTTP/1.1 fast path's connections to sandboxes
	dialer   net.Dialer
	slots    chan struct{}
	sessions session
	keyCache keyCache

	mu        sync.Mutex
	closed    bool
	done      chan struct{} // closed with closed
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	drained   chan struct{} // closed when conns becomes empty after close; nil before
}

// New checks cfg and starts the HTTP side; call Serve to accept connections.
func New(cfg Config) (*Edge, error) {
	if cfg.RunnerID == "" || cfg.BaseDomain == "" || cfg.Routes == nil || cfg.GetCertificate == nil {
		return nil, errors.New("edge: RunnerID, BaseDomain, Routes and GetCertificate are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = defaultMaxConns
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = defaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = defaultIdleTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	if cfg.SessionKey == nil {
		cfg.SessionKey = NewSessionKey()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	e := &Edge{
		sessions:  session{key: cfg.SessionKey, ttl: cfg.SessionTTL, now: time.Now},
		cfg:       cfg,
		log:       cfg.Logger.With("component", "edge", "runner", cfg.RunnerID),
		q:         newQueue(),
		dialer:    net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second, Control: sockmark.Control(cfg.DialMark)},
		slots:     make(chan struct{}, cfg.MaxConns),
		done:      make(chan struct{}),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
	}
	e.tls = &tls.Config{
		MinVersion:     tls.VersionTLS12, // public clients; crypto/tls picks 1.3 when offered
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: cfg.GetCertificate,
	}
	e.srv = &http.Server{
		Handler:           http.HandlerFunc(e.serveHTTP),
		ReadHeaderTimeout: cfg.HandshakeTimeout, // also bounds the TLS handshake in net/http
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelDebug), // handshake noise
	}
	go func() { _ = e.srv.Serve(e.q) }()
	go e.reapIdleBackends()
	return e, nil
}

// Serve accepts connections on ln until ln fails or the edge is closed; it then
// returns http.ErrServerClosed. Serve may run on several listeners at once.
func (e *Edge) Serve(ln net.Listener) error {
	if !e.addListener(ln) {
		return http.ErrServerClosed
	}
	defer e.removeListener(ln)
	var backoff time.Duration
	for {
		select {
		case e.slots <- struct{}{}:
		case <-e.done:
			return http.ErrServerClosed
		}
		c, err := ln.Accept()
		if err != nil {
			<-e.slots
			if e.isClosed() {
				return http.ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("edge: accept: %w", err)
			}
			// Out of file descriptors and the like: wait instead of spinning, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			e.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		ec := &conn{Conn: c, edge: e}
		if !e.track(ec) {
			_ = c.Close()
			<-e.slots
			return http.ErrServerClosed
		}
		go e.route(ec)
	}
}

// Shutdown stops accepting, lets HTTP requests in flight finish and waits for spliced
// and upgraded connections to end, until ctx is done; then closes what is left and
// returns ctx's error.
func (e *Edge) Shutdown(ctx context.Context) error {
	drained := e.beginClose()
	err := e.srv.Shutdown(ctx)
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.closeConns()
	return err
}

// Close closes the listeners and every connection now.
func (e *Edge) Close() error {
	e.beginClose()
	err := e.srv.Close()
	e.closeConns()
	return err
}

func (e *Edge) beginClose() <-chan struct{} {
	var idle []*conn
	e.mu.Lock()
	defer func() {
		e.mu.Unlock()
		for _, c := range idle { // after unlocking: Close untracks
			_ = c.Close()
		}
	}()
	if !e.closed {
		e.closed = true
		close(e.done)
		e.drained = make(chan struct{})
		if len(e.conns) == 0 {
			close(e.drained)
		}
		for ln := range e.listeners {
			_ = ln.Close()
		}
		_ = e.q.Close()
		// Idle fast-path connections close now; the others after their request, when
		// they see closing (serveH1 marks itself idle before it checks).
		for c := range e.conns {
			if c.state.CompareAndSwap(stateIdle, stateClosing) {
				idle = append(idle, c)
			}
		}
	}
	return e.drained
}

// closing reports whether Shutdown or Close has begun.
func (e *Edge) closing() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

func (e *Edge) closeConns() {
	e.mu.Lock()
	cs := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
}

func (e *Edge) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *Edge) addListener(ln net.Listener) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.listeners[ln] = struct{}{}
	return true
}

func (e *Edge) removeListener(ln net.Listener) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.listeners, ln)
}

func (e *Edge) track(c *conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.conns[c] = struct{}{}
	return true
}

// untrack runs once per conn, from its Close: it frees the conn's slot.
func (e *Edge) untrack(c *conn) {
	e.mu.Lock()
	delete(e.conns, c)
	if e.closed && len(e.conns) == 0 {
		select {
		case <-e.drained:
		default:
			close(e.drained)
		}
	}
	e.mu.Unlock()
	<-e.slots
}
