package enroll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// ErrNoPolicy: the runner has not received a policy yet (never reached the control plane).
var ErrNoPolicy = errors.New("no policy received from the control plane yet")

// PolicyCache is the last policy the control plane sent, kept in memory and in a file so
// it survives a restart while the control plane is down. It implements
// policy.Source, for the runner's own checks (runnerapi.Server.WithPolicy).
type PolicyCache struct {
	path string

	mu    sync.RWMutex
	known bool
	state cachedPolicy
}

type cachedPolicy struct {
	Policy     json.RawMessage `json:"policy"` // null: never set
	Revision   int64           `json:"revision"`
	Etag       string          `json:"etag"`
	ReceivedAt time.Time       `json:"received_at"`
}

// OpenPolicyCache loads the cache of the runner with data dir dataDir (empty when none).
func OpenPolicyCache(dataDir string) (*PolicyCache, error) {
	c := &PolicyCache{path: filepath.Join(Dir(dataDir), policyFile)}
	b, err := os.ReadFile(c.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return c, nil
	case err != nil:
		return nil, err
	}
	if err := json.Unmarshal(b, &c.state); err != nil {
		return nil, fmt.Errorf("%s: %w", c.path, err)
	}
	if string(c.state.Policy) == "null" {
		c.state.Policy = nil
	}
	c.known = true
	return c, nil
}

// Policy returns the cached policy document (nil when never set) and its revision; the
// runner ID is its own. ErrNoPolicy before the first reply.
func (c *PolicyCache) Policy(context.Context, string) ([]byte, int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.known {
		return nil, 0, ErrNoPolicy
	}
	return c.state.Policy, c.state.Revision, nil
}

// Revision is the cached revision (0 when none).
func (c *PolicyCache) Revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.state.Revision
}

// set stores a received policy; it reports whether it changed.
func (c *PolicyCache) set(doc []byte, rev int64, etag string) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known && c.state.Revision == rev && c.state.Etag == etag && string(c.state.Policy) == string(doc) {
		return false, nil
	}
	next := cachedPolicy{Revision: rev, Etag: etag, ReceivedAt: time.Now().UTC()}
	if len(doc) > 0 {
		next.Policy = append(json.RawMessage(nil), doc...)
	}
	b, err := json.MarshalIndent(next, "", "  ")
	if err != nil {
		return false, err
	}
	// Memory first: the runner enforces what it was told even if the disk fails.
	c.state, c.known = next, true
	if err := writeAtomic(c.path, append(b, '\n'), 0o600); err != nil {
		return true, fmt.Errorf("save policy: %w", err)
	}
	return true, nil
}

// Status is what a heartbeat reports; Heartbeater fills in the runner ID and revision.
type Status = controlplanev1.HeartbeatRequest

// HeartbeatConfig configures a Heartbeater.
type HeartbeatConfig struct {
	Identity *Identity
	Cache    *PolicyCache
	// Interval between heartbeats; default controlplane.DefaultHeartbeatInterval.
	Interval time.Duration
	// MaxBackoff bounds the wait between retries while the control plane is
	// unreachable; default 30 s (never below Interval).
	MaxBackoff time.Duration
	// Status reports the runner's state (runner_id and policy_revision are set here).
	Status func(context.Context) (*Status, error)
	Logger *slog.Logger
}

// Heartbeater heartbeats the control plane and keeps the policy cache current.
type Heartbeater struct {
	cfg    HeartbeatConfig
	client controlplanev1connect.RunnerRegistrationServiceClient
	hc     *http.Client

	mu            sync.Mutex
	desired       string
	desiredSums   [2]string // sandboxd, sandbox-agent for the runner's arch
	lastOK        time.Time
	lastErr       error
	desiredLogged string
}

// NewHeartbeater returns a heartbeater over mTLS with the runner's certificate.
func NewHeartbeater(cfg HeartbeatConfig) (*Heartbeater, error) {
	if cfg.Identity == nil || cfg.Cache == nil || cfg.Status == nil {
		return nil, errors.New("enroll: heartbeat needs an identity, a policy cache and a status")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = controlplane.DefaultHeartbeatInterval
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.Interval)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host := cfg.Identity.ControlPlane
	if h, _, err := splitHost(host); err == nil {
		host = h
	}
	cert := cfg.Identity.Cert
	tlsCfg := pki.ClientTLSConfig(&cert, cfg.Identity.CAs, host)
	hc := httpClient(tlsCfg)
	return &Heartbeater{cfg: cfg, hc: hc,
		client: controlplanev1connect.NewRunnerRegistrationServiceClient(hc, "https://"+cfg.Identity.ControlPlane)}, nil
}

// Beat sends one heartbeat and applies the reply.
func (h *Heartbeater) Beat(ctx context.Context) error {
	st, err := h.cfg.Status(ctx)
	if err != nil {
		return fmt.Errorf("runner status: %w", err)
	}
	st.RunnerId = h.cfg.Identity.RunnerID
	st.PolicyRevision = h.cfg.Cache.Revision()
	res, err := h.client.Heartbeat(ctx, connect.NewRequest(st))
	if err != nil {
		return err
	}
	changed, err := h.cfg.Cache.set([]byte(res.Msg.GetPolicyJson()), res.Msg.GetPolicyRevision(), res.Msg.GetEtag())
	if changed {
		h.cfg.Logger.Info("runner policy received", "runner", h.cfg.Identity.RunnerID, "policy_revision", res.Msg.GetPolicyRevision(), "etag", res.Msg.GetEtag())
	}
	h.mu.Lock()
	h.lastOK = time.Now()
	if d := res.Msg.GetDesiredVersion(); d != "" && d != h.desiredLogged && d != st.GetVersion() {
		h.desiredLogged = d
		h.cfg.Logger.Info("control plane asks for another runner version", "running", st.GetVersion(), "desired", d)
	}
	h.desired = res.Msg.GetDesiredVersion()
	h.desiredSums = [2]string{res.Msg.GetDesiredSandboxdSha256(), res.Msg.GetDesiredAgentSha256()}
	h.mu.Unlock()
	return err
}

// DesiredVersion is the version the control plane last asked for ("" for none).
func (h *Heartbeater) DesiredVersion() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.desired
}

// DesiredBinaries is the version the control plane last asked for and the SHA-256 of
// its sandboxd and sandbox-agent for the architecture the runner reported ("" when the
// release record has none).
func (h *Heartbeater) DesiredBinaries() (version, sandboxdSHA256, agentSHA256 string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.desired, h.desiredSums[0], h.desiredSums[1]
}

// LastSuccess is when a heartbeat last went through (zero before the first).
func (h *Heartbeater) LastSuccess() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastOK
}

// Run heartbeats until ctx ends: every Interval while the control plane answers; with
// exponential backoff (and jitter), up to MaxBackoff, while it does not. Failures are
// logged once per outage; the runner goes on with its cached policy meanwhile.
func (h *Heartbeater) Run(ctx context.Context) {
	defer h.hc.CloseIdleConnections()
	fails := 0
	for {
		c, cancel := context.WithTimeout(ctx, max(h.cfg.Interval, 5*time.Second))
		err := h.Beat(c)
		cancel()
		if ctx.Err() != nil {
			return
		}
		wait := h.cfg.Interval
		if err != nil {
			fails++
			if fails == 1 {
				h.cfg.Logger.Warn("control plane unreachable; keeping the last-known policy and retrying", "runner", h.cfg.Identity.RunnerID,
					"control_plane", h.cfg.Identity.ControlPlane, "policy_revision", h.cfg.Cache.Revision(), "err", err)
			} else {
				h.cfg.Logger.Debug("heartbeat failed", "attempt", fails, "err", err)
			}
			if connect.CodeOf(err) == connect.CodePermissionDenied || connect.CodeOf(err) == connect.CodeNotFound {
				h.cfg.Logger.Error("control plane refuses this runner's heartbeats", "err", err)
			}
			wait = h.cfg.Interval << min(fails-1, 16)
			wait = min(wait, h.cfg.MaxBackoff)
			wait = wait/2 + rand.N(wait/2+1)
		} else if fails > 0 {
			h.cfg.Logger.Info("control plane reachable again", "runner", h.cfg.Identity.RunnerID, "after_attempts", fails)
			fails = 0
		}
		h.mu.Lock()
		h.lastErr = err
		h.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
