// Package sandbox is a Go client for the coreweave.sandbox.v1 API as served by sandboxd
// (and CoreWeave Sandbox). It follows the semantics of the official Python client: create
// returns at once and Wait polls until the sandbox runs, commands run over the
// bidirectional StreamExec RPC with stdin half-close as EOF, large files fall back to a
// streamed `cat`, and Stop deletes and then polls until a terminal state.
//
//	c, err := sandbox.FromEnv() // CWSANDBOX_BASE_URL, CWSANDBOX_API_KEY
//	sb, err := c.Create(ctx, sandbox.Spec{Image: "python:3.11"})
//	err = sb.Wait(ctx)
//	out, _, code, err := sb.Run(ctx, []string{"python", "-c", "print(2+2)"})
//	err = sb.Stop(ctx, 10*time.Second)
//
// A sandbox may hold several containers (Spec.Containers, or a Compose file with
// CreateFromFile); exec, files and logs go to the primary unless InContainer or an
// option's Container names another, and Info.Containers reports each one's state:
//
//	sb, err := c.Create(ctx, sandbox.Spec{Containers: []sandbox.Container{
//		{Name: "app", Image: "busybox", Command: "sleep", Args: []string{"infinity"}},
//		{Name: "cache", Image: "redis:7", StartupProbe: &sandbox.Probe{Exec: []string{"redis-cli", "ping"}}},
//	}})
//	out, _, code, err := sb.InContainer("cache").Run(ctx, []string{"redis-cli", "ping"})
//
// Scratch volumes (Spec.Volumes) can be snapshotted while the sandbox runs
// (Sandbox.Snapshot waits until the snapshot is READY) or as it stops
// (StopWithSnapshots), and a new sandbox's volume can start from a snapshot
// (ScratchVolume.RestoreFrom); Client.GetSnapshot, ListSnapshots and DeleteSnapshot
// manage them:
//
//	sb, err := c.Create(ctx, sandbox.Spec{Volumes: []sandbox.ScratchVolume{{Name: "work", MountPath: "/work"}}})
//	snap, err := sb.Snapshot(ctx, "work")
//	fork, err := c.Create(ctx, sandbox.Spec{Volumes: []sandbox.ScratchVolume{{Name: "work", MountPath: "/work", RestoreFrom: snap.ID}}})
//
// sandboxd's own SandboxStateService (beside the wire protocol, same credentials)
// pauses, resumes and forks running sandboxes and changes their lifetime. A paused
// sandbox is StatePaused: not terminal, and Wait returns at once for it as for a running
// one (exec, files and endpoint traffic resume it first unless auto-resume is off, in
// which case they fail with ErrNotRunning). Under the gvisor runtime class a pause
// checkpoints the sandbox and releases its CPU and memory; under runc it freezes it
// (memory kept and counted), and a release or a fork fails with
// ErrCheckpointNotSupported:
//
//	st, err := sb.Pause(ctx, sandbox.PauseOptions{})        // st.ResourcesReleased: checkpointed
//	_, err = sb.Resume(ctx)                                  // same ID, address, endpoints; processes continue
//	forks, err := sb.Fork(ctx, 3, sandbox.ForkOptions{})    // 3 copies, each its own ID and address
//	var partial *sandbox.PartialForkError                   // some forks failed: errors.As(err, &partial)
//	lt, err := sb.ExtendLifetime(ctx, time.Hour)
//
// Templates are organization-scoped partial specs (SandboxTemplateService) that
// sandboxes start from; overrides replace the fields they set (CreateFromTemplate with a
// wire PartialSandboxSpec, or RunTemplate with Go Overrides):
//
//	tm, err := c.CreateTemplate(ctx, "py", &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: "python:3.11"}}})
//	sb, err := c.RunTemplate(ctx, "py", sandbox.Overrides{Env: map[string]string{"DEBUG": "1"}}, sandbox.FromTemplateOptions{})
//	sb.Info().SourceTemplateID // tm.ID
//
// Image builds (sandboxd's own BuildService) make a template's image from a Dockerfile
// and a directory, inside a builder sandbox; a failed build is a *BuildError naming the
// failing step:
//
//	b, err := c.BuildTemplate(ctx, "py-tools", "./ctx", sandbox.BuildTemplateOptions{})
//	b.Image // <registry>/<org>/py-tools@sha256:…
package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
)

// Environment variables read by FromEnv (and New for empty arguments).
const (
	EnvBaseURL = "CWSANDBOX_BASE_URL"
	EnvAPIKey  = "CWSANDBOX_API_KEY"
)

// ErrNoBaseURL is New's error when neither an argument nor CWSANDBOX_BASE_URL names
// an endpoint: there is no default, so a key is never sent to a host nobody chose.
var ErrNoBaseURL = errors.New("sandbox: no API endpoint: pass a base URL or set " + EnvBaseURL)

// Limits shared with the official client.
const (
	MaxMessageBytes   = 100 << 20 // gRPC send/receive limit
	MaxUnaryFileBytes = 32 << 20  // larger files are streamed through exec
	MaxFileBytes      = 256 << 20 // larger files are refused client-side
	stdinChunk        = 64 << 10
)

// Per-call deadlines of the official client.
const (
	createTimeout  = 300 * time.Second
	getTimeout     = 15 * time.Second
	listTimeout    = 300 * time.Second
	fileTimeout    = 300 * time.Second
	deleteTimeout  = 300 * time.Second
	waitTimeout    = 300 * time.Second
	retryBudget    = 30 * time.Second
	maxRetryDelay  = 10 * time.Second
	notFoundGrace  = 2 * time.Second
	maxListPages   = 100
	defaultLogWait = 300 * time.Second
)

// Client talks to one API endpoint with one API key. It is safe for concurrent use.
type Client struct {
	baseURL string
	svc     sandboxv1connect.SandboxServiceClient
	state   statev1connect.SandboxStateServiceClient
	tmpl    sandboxv1connect.SandboxTemplateServiceClient
	vols    sandboxv1connect.VolumeServiceClient
	build   buildv1connect.BuildServiceClient
	quota   quotav1connect.QuotaServiceClient
	setting sandboxv1connect.SettingsServiceClient
	secret  settingsv1connect.SecretServiceClient
	http    *http.Client
	direct  *direct
}

type config struct {
	httpClient *http.Client
	caFile     string
	tlsConfig  *tls.Config
	userAgent  string
	dataPlane  DataPlaneMode
}

// Option configures a Client.
type Option func(*config)

// WithHTTPClient makes the client use hc as is (its transport must speak HTTP/2 for gRPC).
func WithHTTPClient(hc *http.Client) Option { return func(c *config) { c.httpClient = hc } }

// WithCAFile trusts the PEM certificates in path (e.g. sandboxd's ca.pem) in addition
// to the system roots for https:// endpoints.
func WithCAFile(path string) Option { return func(c *config) { c.caFile = path } }

// WithTLSConfig sets the TLS configuration for https:// endpoints.
func WithTLSConfig(tc *tls.Config) Option { return func(c *config) { c.tlsConfig = tc } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *config) { c.userAgent = ua } }

// FromEnv returns a client for CWSANDBOX_BASE_URL with CWSANDBOX_API_KEY.
func FromEnv(opts ...Option) (*Client, error) { return New("", "", opts...) }

// New returns a client for baseURL (http:// = plaintext h2c gRPC, https:// = TLS) that
// sends apiKey as a Bearer token on every call. Empty arguments default to the
// environment (CWSANDBOX_BASE_URL, CWSANDBOX_API_KEY); no endpoint at all is
// ErrNoBaseURL; an empty key sends no authorization at all.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	if baseURL == "" {
		baseURL = os.Getenv(EnvBaseURL)
	}
	if baseURL == "" {
		return nil, ErrNoBaseURL
	}
	if apiKey == "" {
		apiKey = os.Getenv(EnvAPIKey)
	}
	u, err := parseBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	hc := cfg.httpClient
	if hc == nil {
		hc, err = newHTTPClient(u.Scheme, cfg)
		if err != nil {
			return nil, err
		}
	}
	copts := []connect.ClientOption{
		connect.WithGRPC(),
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
	}
	if apiKey != "" || cfg.userAgent != "" {
		copts = append(copts, connect.WithInterceptors(headers{key: apiKey, ua: cfg.userAgent}))
	}
	if cfg.dataPlane == "" {
		cfg.dataPlane = DataPlaneAuto
	}
	return &Client{baseURL: u.String(), http: hc, svc: sandboxv1connect.NewSandboxServiceClient(hc, u.String(), copts...),
		state:   statev1connect.NewSandboxStateServiceClient(hc, u.String(), copts...),
		tmpl:    sandboxv1connect.NewSandboxTemplateServiceClient(hc, u.String(), copts...),
		vols:    sandboxv1connect.NewVolumeServiceClient(hc, u.String(), copts...),
		build:   buildv1connect.NewBuildServiceClient(hc, u.String(), copts...),
		quota:   quotav1connect.NewQuotaServiceClient(hc, u.String(), copts...),
		setting: sandboxv1connect.NewSettingsServiceClient(hc, u.String(), copts...),
		secret:  settingsv1connect.NewSecretServiceClient(hc, u.String(), copts...),
		direct:  &direct{mode: cfg.dataPlane, conns: map[directKey]*directConn{}, retryAt: map[string]time.Time{}}}, nil
}

// BaseURL is the endpoint the client talks to.
func (c *Client) BaseURL() string { return c.baseURL }

// Service is the generated client underneath, for calls this package does not wrap.
func (c *Client) Service() sandboxv1connect.SandboxServiceClient { return c.svc }

func parseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil {
		return nil, fmt.Errorf("sandbox: invalid base URL %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("sandbox: base URL %q: scheme must be http or https", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("sandbox: base URL %q has no host", raw)
	}
	if u.Path != "" || u.RawQuery != "" {
		return nil, fmt.Errorf("sandbox: base URL %q must not have a path or query", raw)
	}
	return u, nil
}

func newHTTPClient(scheme string, cfg config) (*http.Client, error) {
	t := &http.Transport{Proxy: http.ProxyFromEnvironment, Protocols: new(http.Protocols)}
	if scheme == "http" {
		t.Protocols.SetUnencryptedHTTP2(true)
		return &http.Client{Transport: t}, nil
	}
	t.Protocols.SetHTTP2(true)
	tc := cfg.tlsConfig
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	} else {
		tc = tc.Clone()
	}
	if cfg.caFile != "" {
		pem, err := os.ReadFile(cfg.caFile)
		if err != nil {
			return nil, fmt.Errorf("sandbox: CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("sandbox: CA file " + cfg.caFile + " holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	t.TLSClientConfig = tc
	return &http.Client{Transport: t}, nil
}

// headers adds authorization (and a user agent) to every call, unary and streaming.
type headers struct{ key, ua string }

func (h headers) set(hd http.Header) {
	if h.key != "" {
		hd.Set("Authorization", "Bearer "+h.key)
	}
	if h.ua != "" {
		hd.Set("User-Agent", h.ua)
	}
}

func (h headers) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		h.set(req.Header())
		return next(ctx, req)
	}
}

func (h headers) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		h.set(conn.RequestHeader())
		return conn
	}
}

func (h headers) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// withTimeout bounds one call by d (or the caller's earlier deadline).
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
