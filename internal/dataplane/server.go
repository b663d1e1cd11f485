package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// Sandboxes is what the data plane needs of its runner (runner.Local).
type Sandboxes interface {
	Get(ctx context.Context, id string) (runner.Sandbox, error)
	// Agent returns the agent of the sandbox's container ("" = the primary), waiting
	// while the sandbox starts.
	Agent(ctx context.Context, id, container string) (agentv1connect.AgentServiceClient, error)
	// Logs reads the log of the sandbox's container ("" = the primary), also once it has
	// ended (runner.Runner.Logs).
	Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error
}

// Config configures a Server.
type Config struct {
	// ClientCAs verifies client certificates: the data-plane CA.
	ClientCAs *x509.CertPool
	// GetCertificate serves the listener's certificate (from the data-plane CA, naming the
	// host of the URI the runner reports).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	Sandboxes      Sandboxes
	Logger         *slog.Logger
	// Policies, when set, gives the runner's policy (RunnerID's; typically the cache of
	// what the control plane sent): a call from a TCP peer outside its
	// control_plane_access.source_ip_allowlist is refused like the gateway refuses it
	// (PERMISSION_DENIED CWSANDBOX_SOURCE_IP_NOT_ALLOWED). Clients reach the data plane
	// directly, so the peer is the caller; X-Forwarded-For is never read here.
	Policies policy.Source
	RunnerID string
	// Interceptors run on every call after tracing's (the process's metrics: cmd/sandboxd
	// passes metrics.Default.Interceptor(metrics.PathDirect)).
	Interceptors []connect.Interceptor
}

// Server serves SandboxDataPlaneService for the sandboxes of one runner.
type Server struct {
	cfg   Config
	calls atomic.Int64
	now   func() time.Time
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.ClientCAs == nil || cfg.GetCertificate == nil || cfg.Sandboxes == nil {
		return nil, errors.New("dataplane: ClientCAs, GetCertificate and Sandboxes are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, now: time.Now}, nil
}

// Calls is how many data calls the server has admitted (their certificate checked).
func (s *Server) Calls() int64 { return s.calls.Load() }

// TLSConfig: TLS 1.3, HTTP/2, a client certificate chaining to the data-plane CA
// required. Every new connection is logged with the identity it presents.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     []string{"h2"},
		GetCertificate: s.cfg.GetCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      s.cfg.ClientCAs,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				return errors.New("dataplane: no verified client certificate")
			}
			leaf := cs.VerifiedChains[0][0]
			id, err := ParseIdentity(leaf)
			if err != nil {
				s.cfg.Logger.Warn("direct data-plane connection refused", "err", err)
				return fmt.Errorf("dataplane: %w", err)
			}
			s.cfg.Logger.Debug("direct data-plane client connected", "sandbox", id.SandboxID, "org", id.Org, "perms", id.Perms, "not_after", leaf.NotAfter)
			return nil
		},
	}
}

type peerKey struct{}

// remoteKey holds the TCP peer's address (netip.Addr) in a call's context.
type remoteKey struct{}

// Handler serves the data-plane service (gRPC, Connect, gRPC-Web) to verified TLS peers.
func (s *Server) Handler() http.Handler {
	path, h := sandboxv1connect.NewSandboxDataPlaneServiceHandler(relay.Relay{Src: source{s}},
		connect.WithReadMaxBytes(relay.MaxMessageBytes), connect.WithSendMaxBytes(relay.MaxMessageBytes),
		// Responses are never compressed (gzip-compressed requests are still read):
		// grpc-python and connect-go offer gzip on every call, and gzip at ~60 MB/s a core
		// made a 32 MiB ReadFile slower direct than through the gateway. The link to a
		// runner is faster than that, and file content is often incompressible.
		connect.WithCompressMinBytes(math.MaxInt),
		connect.WithInterceptors(tracing.PublicServer()), connect.WithInterceptors(s.cfg.Interceptors...))
	mux := http.NewServeMux()
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "a client certificate is required", http.StatusUnauthorized)
			return
		}
		ctx := context.WithValue(r.Context(), peerKey{}, r.TLS.VerifiedChains[0][0])
		var remote netip.Addr // invalid (unknown) unless the peer parses
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			remote = ap.Addr().Unmap()
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, remoteKey{}, remote)))
	}))
	return mux
}

// HTTPServer serves Handler over TLSConfig (give it to ServeTLS with empty file names).
func (s *Server) HTTPServer() *http.Server {
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         s.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second,
		Protocols:         new(http.Protocols),
		HTTP2:             agent.HTTP2Config(),
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug),
	}
	srv.Protocols.SetHTTP2(true)
	return srv
}

// Listener is a running data-plane listener.
type Listener struct {
	Addr   net.Addr
	Server *Server // set by Start
	srv    *http.Server
}

// Listen serves s on addr.
func (s *Server) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	srv := s.HTTPServer()
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return &Listener{Addr: ln.Addr(), srv: srv}, nil
}

// Port is the port the listener listens on.
func (l *Listener) Port() int { return l.Addr.(*net.TCPAddr).Port }

// Close stops the listener, giving open calls a few seconds.
func (l *Listener) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.srv.Shutdown(ctx); err != nil {
		_ = l.srv.Close()
	}
}

// source is the data plane's relay.DataSource: the caller's certificate must be valid
// now, name the addressed sandbox and grant the operation, and the sandbox must live on
// this runner in the certificate's organization.
type source struct{ s *Server }

func (src source) DataAgent(ctx context.Context, perm sandboxv1.SandboxDataPermission, sandboxID, container string) (agentv1connect.AgentServiceClient, error) {
	s := src.s
	sb, err := src.authorize(ctx, perm, sandboxID, container)
	if err != nil {
		return nil, err
	}
	if sb.State.Terminal() || sb.State == runner.StateTerminating {
		return nil, apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s is %s", sandboxID, sb.State), map[string]string{"sandbox_id": sandboxID, "state": sb.State.String()})
	}
	a, err := s.cfg.Sandboxes.Agent(ctx, sandboxID, container)
	if err != nil {
		if ctx.Err() != nil {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("sandbox %s did not start in time: %w", sandboxID, ctx.Err()))
		}
		return nil, runner.APIError(sandboxID, err, runner.SpecField)
	}
	s.calls.Add(1)
	s.cfg.Logger.Debug("direct data-plane call", "sandbox", sandboxID, "perm", PermName(perm))
	return a, nil
}

// DataLogs serves the log also of a sandbox that has ended (while the runner keeps it).
func (src source) DataLogs(ctx context.Context, sandboxID, container string) (relay.LogReader, error) {
	s := src.s
	perm := sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS
	if _, err := src.authorize(ctx, perm, sandboxID, container); err != nil {
		return nil, err
	}
	s.calls.Add(1)
	s.cfg.Logger.Debug("direct data-plane call", "sandbox", sandboxID, "perm", PermName(perm))
	return func(ctx context.Context, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
		return s.cfg.Sandboxes.Logs(ctx, sandboxID, container, req, send)
	}, nil
}

// authorize checks the caller's certificate against the call and returns the sandbox.
func (src source) authorize(ctx context.Context, perm sandboxv1.SandboxDataPermission, sandboxID, container string) (runner.Sandbox, error) {
	s := src.s
	leaf, _ := ctx.Value(peerKey{}).(*x509.Certificate)
	if leaf == nil {
		return runner.Sandbox{}, apierr.Newf(apierr.Unauthenticated, "a data-plane client certificate is required")
	}
	// The handshake checked the chain; a connection may outlive its certificate.
	if t := s.now(); t.After(leaf.NotAfter) || t.Before(leaf.NotBefore) {
		return runner.Sandbox{}, apierr.Newf(apierr.Unauthenticated,
			"the data-plane client certificate expired at %s; ask ConnectSandbox for a new one", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	id, err := ParseIdentity(leaf)
	if err != nil {
		return runner.Sandbox{}, apierr.Newf(apierr.Unauthenticated, "not a data-plane client certificate: %v", err)
	}
	if sandboxID == "" {
		return runner.Sandbox{}, apierr.Invalid(apierr.InvalidRequest, "sandbox_id is required", []apierr.Violation{{Field: "sandbox_id", Description: "is required"}})
	}
	if sandboxID != id.SandboxID {
		return runner.Sandbox{}, apierr.New(apierr.PermissionDenied,
			fmt.Sprintf("the client certificate is for sandbox %s, not %s", id.SandboxID, sandboxID), map[string]string{"sandbox_id": sandboxID})
	}
	if !id.Has(perm) {
		return runner.Sandbox{}, apierr.New(apierr.PermissionDenied,
			fmt.Sprintf("the client certificate does not grant %s on sandbox %s", PermName(perm), sandboxID),
			map[string]string{"sandbox_id": sandboxID, "permission": perm.String()})
	}
	sb, err := s.cfg.Sandboxes.Get(ctx, sandboxID)
	if errors.Is(err, runtime.ErrNotFound) || err == nil && sb.Spec.Meta[runtime.MetaOrg] != id.Org {
		return runner.Sandbox{}, runner.NotFoundError(sandboxID)
	}
	if err == nil {
		err = src.checkSource(ctx)
	}
	if err != nil {
		return runner.Sandbox{}, runner.APIError(sandboxID, err, runner.SpecField)
	}
	// The certificate grants the whole sandbox: any of its containers (the request's
	// container field; "" = the primary), checked once the caller is known to see it.
	if c, _ := sb.Spec.Find(container); c == nil {
		return runner.Sandbox{}, runner.APIError(sandboxID, &runner.ContainerNotFoundError{Sandbox: sandboxID, Container: container}, runner.SpecField)
	}
	return sb, nil
}

// checkSource refuses a caller outside the runner's source-IP allowlist (Config.Policies;
// none: every caller); a policy that cannot be read or parsed refuses the call.
func (src source) checkSource(ctx context.Context) error {
	s := src.s
	if s.cfg.Policies == nil {
		return nil
	}
	doc, _, err := s.cfg.Policies.Policy(ctx, s.cfg.RunnerID)
	if err != nil {
		return apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable, "runner %s cannot read its policy: %v", s.cfg.RunnerID, err), 0)
	}
	p := &policy.Policy{}
	if len(doc) > 0 {
		if p, err = policy.Parse(doc); err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("policy of runner %s: %w", s.cfg.RunnerID, err))
		}
	}
	addr, _ := ctx.Value(remoteKey{}).(netip.Addr)
	if policy.SourceAllowed(p, addr) {
		return nil
	}
	a := policy.AddrString(addr)
	s.cfg.Logger.Info("direct data-plane call refused by the source-IP allowlist", "runner", s.cfg.RunnerID, "source_ip", a)
	return apierr.New(apierr.SourceIPNotAllowed,
		fmt.Sprintf("calls from %s are not allowed on the sandboxes of runner %s (its policy's %s)", a, s.cfg.RunnerID, policy.ConstraintSourceIPAllowlist),
		map[string]string{"source_ip": a, "runner_id": s.cfg.RunnerID})
}

// ServerCertTTL is the lifetime of a listener's certificate; it is renewed at half-life.
const ServerCertTTL = 24 * time.Hour

// ListenConfig configures Start.
type ListenConfig struct {
	Listen string // host:port
	// Host is the host clients reach the listener by (its certificate names it);
	// default the listen host, 127.0.0.1 when that is empty or unspecified.
	Host string
	CA   *pki.CA // the data-plane CA
	// Without CA: Issue makes the listener's certificate for host (e.g. asks the control
	// plane) and ClientCAs verifies clients (the data-plane CA's certificate).
	Issue     func(host string) (tls.Certificate, error)
	ClientCAs *x509.CertPool
	Sandboxes Sandboxes
	Logger    *slog.Logger
	// Policies, RunnerID and Interceptors: see Config.
	Policies     policy.Source
	RunnerID     string
	Interceptors []connect.Interceptor
}

// HostOf is the host clients reach a data plane listening on listen by: host when set,
// else the listen host, 127.0.0.1 when that is empty or unspecified (ListenConfig.Host).
func HostOf(listen, host string) (string, error) {
	if host != "" {
		return host, nil
	}
	h, _, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("data plane: %w", err)
	}
	if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
		return "127.0.0.1", nil
	}
	return h, nil
}

// Start serves the data plane on cfg.Listen with a certificate from cfg.CA and returns the
// listener and the URI the runner reports (https://HOST:PORT).
func Start(cfg ListenConfig) (*Listener, string, error) {
	if cfg.CA == nil && (cfg.Issue == nil || cfg.ClientCAs == nil) {
		return nil, "", errors.New("dataplane: no CA, and no issuer with client CAs")
	}
	host, err := HostOf(cfg.Listen, cfg.Host)
	if err != nil {
		return nil, "", err
	}
	issue, clientCAs := cfg.Issue, cfg.ClientCAs
	if cfg.CA != nil {
		dns, ips := pki.SplitHosts(nil, []string{host})
		issue = func(string) (tls.Certificate, error) {
			return cfg.CA.IssueServer("sandboxd data plane", dns, ips, ServerCertTTL)
		}
		clientCAs = cfg.CA.Pool()
	}
	getCert := pki.Renewing(func() (tls.Certificate, error) { return issue(host) })
	if _, err := getCert(); err != nil {
		return nil, "", fmt.Errorf("data-plane certificate: %w", err)
	}
	s, err := New(Config{ClientCAs: clientCAs, Sandboxes: cfg.Sandboxes, Logger: cfg.Logger, Policies: cfg.Policies, RunnerID: cfg.RunnerID,
		Interceptors: cfg.Interceptors, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return getCert() }})
	if err != nil {
		return nil, "", err
	}
	l, err := s.Listen(cfg.Listen)
	if err != nil {
		return nil, "", err
	}
	l.Server = s
	return l, "https://" + net.JoinHostPort(host, strconv.Itoa(l.Port())), nil
}
