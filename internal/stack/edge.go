package stack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// EdgeConfig configures a runner's edge.
type EdgeConfig struct {
	Listen     string // host:port of the public listener
	RunnerID   string
	BaseDomain string // endpoints are <port>-<sandbox>.<RunnerID>.<BaseDomain>
	// CA issues (and renews) the wildcard certificate *.<RunnerID>.<BaseDomain>, unless
	// GetCertificate serves it (a runner registered with a control plane gets it there).
	CA             *pki.CA
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Authorize accepts an API key for a sandbox of org (TOKEN endpoints); nil refuses
	// every TOKEN request.
	Authorize func(ctx context.Context, token, org string) error
	// KeyActive says whether the API key of a browser login session is still active
	// (KeyActivity); nil: sessions last until they expire, even once their key is revoked.
	KeyActive func(ctx context.Context, keyID, org string) error
	// SessionKeyFile keeps the key that signs browser sessions of TOKEN endpoints (created
	// when absent); "": a new key per start, so a restart signs everyone out.
	SessionKeyFile string
	// DialMark marks the edge's connections to sandboxes: a local stack's
	// Stack.EdgeDialMark, without which its network refuses them. 0 for Kubernetes
	// runners (their sandboxes are Pods; nothing to mark for).
	DialMark uint32
	Logger   *slog.Logger
}

// Edge is a running edge: its listener's address and how to stop it.
type Edge struct {
	Addr net.Addr
	e    *edge.Edge
	stop context.CancelFunc
	done chan struct{}
}

// StartEdge publishes the endpoints of r's sandboxes on cfg.Listen: each running sandbox's
// HTTPS and passthrough services get a route to its IP, kept in step with the runner.
func StartEdge(r *runner.Runner, cfg EdgeConfig) (*Edge, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cert := cfg.GetCertificate
	if cert == nil {
		var err error
		if cert, err = edge.WildcardCertificate(cfg.CA, cfg.RunnerID, cfg.BaseDomain, 0); err != nil {
			return nil, fmt.Errorf("edge certificate: %w", err)
		}
	}
	var sessionKey []byte
	if cfg.SessionKeyFile != "" {
		var err error
		if sessionKey, err = pki.LoadOrCreateSecret(cfg.SessionKeyFile); err != nil {
			return nil, err
		}
	}
	var table edge.Table
	e, err := edge.New(edge.Config{RunnerID: cfg.RunnerID, BaseDomain: cfg.BaseDomain, Routes: liveRoutes{&table, r},
		GetCertificate: cert, Authorize: cfg.Authorize, KeyActive: cfg.KeyActive, SessionKey: sessionKey, DialMark: cfg.DialMark, Logger: cfg.Logger,
		Wake: r.Wake})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	out := &Edge{Addr: ln.Addr(), e: e, stop: stop, done: make(chan struct{})}
	go func() { _ = e.Serve(ln) }()
	go func() {
		defer close(out.done)
		syncRoutes(ctx, r, &table, cfg.Logger)
	}()
	return out, nil
}

// Port is the port the edge listens on.
func (e *Edge) Port() int { return e.Addr.(*net.TCPAddr).Port }

// Close stops the edge, giving open connections a few seconds.
func (e *Edge) Close() {
	e.stop()
	<-e.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.e.Shutdown(ctx)
}

// syncRoutes keeps t equal to the routes of r's running sandboxes until ctx ends.
func syncRoutes(ctx context.Context, r *runner.Runner, t *edge.Table, log *slog.Logger) {
	known := map[string][]edge.Route{}
	for {
		changed := r.Changed()
		live := map[string]bool{}
		for _, sb := range r.List() {
			routes := routesOf(sb)
			if len(routes) == 0 {
				continue
			}
			live[sb.ID] = true
			if reflect.DeepEqual(known[sb.ID], routes) {
				continue
			}
			if err := t.Set(sb.ID, routes); err != nil {
				log.Error("edge: routes of a sandbox refused", "sandbox", sb.ID, "err", err)
				continue
			}
			known[sb.ID] = routes
		}
		for id := range known {
			if !live[id] {
				t.Delete(id)
				delete(known, id)
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// liveRoutes is the edge's Routes: the table syncRoutes keeps, and for a name the table
// does not know (yet) the runner's own record of the sandbox (runner.Runner.ServiceOf:
// one map lookup, nothing copied but that service). syncRoutes follows the runner's
// changes a moment later, so without the second look a request sent as soon as a client
// saw RUNNING could be answered 404.
type liveRoutes struct {
	t *edge.Table
	r *runner.Runner
}

func (l liveRoutes) Lookup(sandboxID string, port int) (edge.Route, bool) {
	if rt, ok := l.t.Lookup(sandboxID, port); ok {
		return rt, true
	}
	sb, ok := l.r.ServiceOf(sandboxID, port)
	if !ok {
		return edge.Route{}, false
	}
	for _, rt := range routesOf(sb) {
		if rt.Port == port && rt.Validate() == nil {
			return rt, true
		}
	}
	return edge.Route{}, false
}

// routesOf is what the edge publishes of sb: its endpoints while it runs or is paused (a
// request resumes it first, or is answered 503: runner.Runner.Wake).
func routesOf(sb runner.Sandbox) []edge.Route {
	if sb.State != runner.StateRunning && sb.State != runner.StatePaused {
		return nil
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return nil
	}
	var out []edge.Route
	for _, s := range sb.Spec.Services {
		rt := edge.Route{SandboxID: sb.ID, Org: sb.Spec.Meta[runtime.MetaOrg], Port: s.Port,
			Backend: netip.AddrPortFrom(ip, uint16(s.Port))}
		switch s.Endpoint {
		case runtime.EndpointHTTPS:
			rt.Kind, rt.Timeout = edge.KindHTTPS, time.Duration(s.TimeoutSeconds)*time.Second
			if s.TokenAuth {
				rt.Auth, rt.ShareTokenHash = edge.AuthToken, sb.Spec.ShareTokenHash
			}
		case runtime.EndpointPassthrough:
			rt.Kind = edge.KindPassthrough
		default:
			continue
		}
		out = append(out, rt)
	}
	return out
}

// KeyAuthorizer is an EdgeConfig.Authorize that accepts the API keys a authenticates,
// of the sandbox's organization only.
func KeyAuthorizer(a auth.Authenticator) func(ctx context.Context, token, org string) error {
	return func(_ context.Context, token, org string) error {
		p, err := a.Authenticate(token)
		if err != nil {
			return fmt.Errorf("%w: %w", edge.ErrUnauthenticated, err)
		}
		if p.Org != org {
			return errors.New("the key belongs to another organization")
		}
		return nil
	}
}

// KeyActivity is an EdgeConfig.KeyActive over a (nil when a cannot tell, see
// auth.KeyChecker): a key is active while it is not revoked and belongs to org.
func KeyActivity(a auth.Authenticator) func(ctx context.Context, keyID, org string) error {
	kc, ok := a.(auth.KeyChecker)
	if !ok {
		return nil
	}
	return func(_ context.Context, keyID, org string) error {
		p, err := kc.KeyActive(keyID)
		if err != nil {
			return err
		}
		if p.Org != org {
			return errors.New("the key belongs to another organization")
		}
		return nil
	}
}
