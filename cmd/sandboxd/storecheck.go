package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/metrics"
)

// A gateway given --control-plane authenticates API keys, keeps the sandbox index and
// serves the audit log from its own store (--store), while the admin API it forwards
// writes to the control plane's. Two stores would make keys made through the admin API
// useless here and leave the control plane's admin writes out of the audit log, so the
// gateway checks that the control plane proves the gateway's store (controlplane.CheckStore).
// The control plane is never allowed to take the sandbox API down:
//
//   - at start, one check: another store refuses the start (the error names both --store
//     flags). Any other outcome starts the gateway at once; until a check passes, the
//     admin proxy answers UNAVAILABLE (CWSANDBOX_CONTROL_PLANE_STORE_UNVERIFIED, RetryInfo)
//     and sandboxes are served;
//   - then every storeCheckInterval (a tenth of it, at least a second, while not
//     verified), on the connection pool the admin API is forwarded on: a new connection,
//     after a reconnect, is checked within one interval, not before its first call. An
//     answer that is not a proof (unreachable, refused, anything else) makes admin calls
//     UNAVAILABLE until the next check passes. Another store found while running does not
//     stop the gateway: it is logged at ERROR, and the admin proxy answers
//     FAILED_PRECONDITION (CWSANDBOX_CONTROL_PLANE_STORE_MISMATCH) until the gateway
//     restarts; sandboxes are still served;
//   - a control plane too old to answer (the exact answer of one: controlplane.
//     ErrStoreProofUnsupported) is logged and admin calls are forwarded (gateways upgraded
//     before their control plane keep working), but only until it has once proved the
//     store: after that the same answer is an ordinary failure.
//
// The gauge cwsandbox_control_plane_store_verified is 1 while the last check proved the
// store, 0 otherwise. /readyz does not depend on the check: readiness routes sandbox
// traffic, which the control plane's store does not concern.
const (
	storeCheckTimeout = 10 * time.Second
)

// storeCheckInterval is how often a verified store is checked again (a variable for tests).
var storeCheckInterval = time.Minute

var storeVerifiedGauge = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "control_plane_store_verified",
	Help: "1 while the gateway's control plane (--control-plane) has proved, at the last check, that it uses the gateway's store; 0 otherwise"})

// storeState is what the gateway knows of its control plane's store.
type storeState int

const (
	storeUnverified storeState = iota // no check passed yet, or the last one failed
	storeVerified                     // the last check proved our store
	storeOlder                        // a control plane older than the check (never proved the store)
	storeMismatch                     // it proved another store: final
)

// storeCheck is a gateway's check of its control plane's store.
type storeCheck struct {
	addr      string // --control-plane
	hc        *http.Client
	identity  string // the gateway's store's
	storeDesc string // the gateway's --store, for messages (no password)
	log       *slog.Logger
	interval  time.Duration // storeCheckInterval; retries while unverified at a tenth of it

	mu       sync.Mutex
	state    storeState
	proved   bool  // a check has passed once: "too old to answer" no longer counts
	last     error // why not verified (storeUnverified), the refusal (storeMismatch)
	reported error // the failure last logged (one log line per change of reason)
}

// newStoreCheck is the check of the control plane at addr through tr, which must not
// follow redirects (a redirect is an answer, not a proof).
func newStoreCheck(addr string, tr http.RoundTripper, identity, storeDesc string, log *slog.Logger) *storeCheck {
	hc := &http.Client{Transport: tr, Timeout: storeCheckTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	_ = metrics.Default.Register(storeVerifiedGauge) // the same collector again: no error
	storeVerifiedGauge.Set(0)
	return &storeCheck{addr: addr, hc: hc, identity: identity, storeDesc: storeDesc, log: log, interval: storeCheckInterval}
}

// once asks the control plane once and records the outcome; it returns the refusal when
// the control plane proves another store.
func (c *storeCheck) once(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
	defer cancel()
	err := controlplane.CheckStore(ctx, c.hc, "https://"+c.addr, c.identity)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == storeMismatch {
		return c.last
	}
	switch {
	case err == nil:
		if c.state != storeVerified {
			c.log.Info("the control plane uses this gateway's store: admin calls are forwarded", "control_plane", c.addr)
		}
		c.state, c.proved, c.last, c.reported = storeVerified, true, nil, nil
		storeVerifiedGauge.Set(1)
		return nil
	case errors.Is(err, controlplane.ErrStoreMismatch):
		c.state = storeMismatch
		c.last = fmt.Errorf("%w: the control plane at --control-plane %s does not use this gateway's store (gateway --store %s): "+
			"API keys made through the admin API would not authenticate at this gateway and its audit log would miss the control plane's admin writes; "+
			"give `sandboxd gateway --store` and `sandboxd controlplane --store` the same database (docs/admin.md, split deployment)",
			controlplane.ErrStoreMismatch, c.addr, c.storeDesc)
		storeVerifiedGauge.Set(0)
		return c.last
	case errors.Is(err, controlplane.ErrStoreProofUnsupported) && !c.proved:
		if c.state != storeOlder {
			c.log.Warn("cannot check that the control plane uses this gateway's store (a release older than the check): admin calls are forwarded unchecked; upgrade the control plane",
				"control_plane", c.addr, "err", err)
		}
		c.state, c.last = storeOlder, nil
		storeVerifiedGauge.Set(0)
		return nil
	case errors.Is(err, controlplane.ErrStoreProofUnsupported):
		err = fmt.Errorf("the control plane answered as a release older than the store check after it had proved this gateway's store: %w", err)
	}
	c.state, c.last = storeUnverified, err
	storeVerifiedGauge.Set(0)
	if c.reported == nil || c.reported.Error() != err.Error() {
		c.reported = err
		what := "control plane unreachable"
		if errors.Is(err, controlplane.ErrStoreProofRefused) {
			what = "the control plane refused the store proof"
		}
		c.log.Warn(what+": admin calls answer UNAVAILABLE until it proves that it uses this gateway's store", "control_plane", c.addr, "err", err)
	}
	return nil
}

// start is the check at start: the refusal when the control plane proves another store,
// nil otherwise (the gateway starts; admin calls wait for a check that passes).
func (c *storeCheck) start(ctx context.Context) error {
	return c.once(ctx)
}

// run checks again until ctx ends or the control plane proves another store (which is
// final: logged at ERROR, admin calls refused, sandboxes still served).
func (c *storeCheck) run(ctx context.Context) {
	for {
		c.mu.Lock()
		every := c.interval
		if c.state == storeUnverified {
			every = c.retry()
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		if err := c.once(ctx); err != nil {
			c.log.Error("admin calls are refused (FAILED_PRECONDITION) until the gateway restarts on the control plane's store; sandboxes are still served", "err", err)
			return
		}
	}
}

// retry is the interval of checks while unverified.
func (c *storeCheck) retry() time.Duration { return max(c.interval/10, time.Second) }

// gate forwards admin calls to next only while the control plane's store is known to be
// the gateway's (or the control plane is too old to tell); it answers them otherwise.
func (c *storeCheck) gate(next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		state, last := c.state, c.last
		c.mu.Unlock()
		var err error
		switch state {
		case storeVerified, storeOlder:
			next.ServeHTTP(w, r)
			return
		case storeMismatch:
			// The gateway's --store stays in its log: the caller need not have a key.
			err = apierr.Newf(apierr.ControlPlaneStoreMismatch, "the control plane at --control-plane %s uses another store than this gateway: "+
				"admin calls are refused until `sandboxd gateway --store` and `sandboxd controlplane --store` name one database and the gateway restarts (docs/admin.md, split deployment)", c.addr)
		default:
			why := "not checked yet"
			if last != nil {
				why = last.Error()
			}
			err = apierr.WithRetry(apierr.Newf(apierr.ControlPlaneStoreUnverified,
				"the control plane's store is not verified yet (the control plane at %s must prove that it uses this gateway's store): %s", c.addr, why), c.retry())
		}
		if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody {
			w.Header().Set("Connection", "close") // its body is not read
		}
		if ew.IsSupported(r) {
			_ = ew.Write(w, r, err)
			return
		}
		apifront.WriteRESTError(w, err)
	})
}

// describeStore names a --store value without its secrets: a PostgreSQL DSN by host and
// database (a password may be in its user info or its query), a SQLite store by its file.
func describeStore(dataDir, dsn string) string {
	switch {
	case dsn == "":
		return "unset: SQLite " + filepath.Join(dataDir, storeFile)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		if err != nil {
			return "postgres://…"
		}
		desc := "postgres://" + u.Host + u.Path
		if sp := u.Query().Get("search_path"); sp != "" {
			desc += "?search_path=" + sp
		}
		return desc
	default:
		return "SQLite " + strings.TrimPrefix(dsn, "sqlite://")
	}
}
