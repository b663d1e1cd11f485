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

	"github.com/sandboxd/sandboxd/internal/controlplane"
)

// A gateway given --control-plane authenticates API keys, keeps the sandbox index and
// serves the audit log from its own store (--store), while the admin API it forwards
// writes to the control plane's. Two stores would make keys made through the admin API
// useless here and leave the control plane's admin writes out of the audit log, so the
// gateway checks that the control plane proves the gateway's store (controlplane.CheckStore):
//
//   - at start: another store refuses the start (the error names both --store flags);
//     an unreachable control plane is waited for up to storeCheckWait, then the gateway
//     starts anyway (sandboxes are served: the control plane being down must not stop
//     them) with its /readyz check "control_plane_store" failing until the check passes;
//   - then every storeCheckInterval, on the connection pool the admin API is forwarded
//     on (so a new connection, after a reconnect, is checked within one interval):
//     another store then stops the gateway with the same error;
//   - a control plane too old to answer is logged and not held against readiness (an
//     upgrade of gateways before their control plane keeps serving); the check runs again
//     every interval, so the first answer after its upgrade counts.
const (
	storeCheckWait     = 30 * time.Second
	storeCheckInterval = time.Minute
	storeCheckTimeout  = 10 * time.Second
)

// storeCheck is a gateway's check of its control plane's store.
type storeCheck struct {
	addr      string // --control-plane
	hc        *http.Client
	identity  string // the gateway's store's
	storeDesc string // the gateway's --store, for messages (no password)
	log       *slog.Logger
	wait      time.Duration // storeCheckWait
	interval  time.Duration // storeCheckInterval; retries while unchecked at a tenth of it

	mu       sync.Mutex
	verified bool  // the control plane proved our store (or cannot tell: an older one)
	last     error // why not verified
}

// once asks the control plane once: a mismatch is returned (the refusal), every other
// outcome is recorded.
func (c *storeCheck) once(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
	defer cancel()
	err := controlplane.CheckStore(ctx, c.hc, "https://"+c.addr, c.identity)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		if !c.verified {
			c.log.Info("the control plane uses this gateway's store", "control_plane", c.addr)
		}
		c.verified, c.last = true, nil
	case errors.Is(err, controlplane.ErrStoreMismatch):
		c.verified = false
		c.last = fmt.Errorf("%w: the control plane at --control-plane %s does not use this gateway's store (gateway --store %s): "+
			"API keys made through the admin API would not authenticate at this gateway and its audit log would miss the control plane's admin writes; "+
			"give `sandboxd gateway --store` and `sandboxd controlplane --store` the same database (docs/admin.md, split deployment)",
			controlplane.ErrStoreMismatch, c.addr, c.storeDesc)
		return c.last
	case errors.Is(err, controlplane.ErrStoreProofUnsupported):
		if !c.verified || c.last == nil {
			c.log.Warn("cannot check that the control plane uses this gateway's store: upgrade the control plane", "control_plane", c.addr, "err", err)
		}
		c.verified, c.last = true, err
	default:
		c.last = err
	}
	return nil
}

// start is the check at start: nil once the control plane proved our store, or when it
// stays unreachable for c.wait (then ready reports it until a later check passes); the
// refusal when it proves another store.
func (c *storeCheck) start(ctx context.Context) error {
	deadline := time.Now().Add(c.wait)
	for {
		if err := c.once(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		verified, last := c.verified, c.last
		c.mu.Unlock()
		if verified {
			return nil
		}
		if !time.Now().Before(deadline) {
			c.log.Warn("control plane unreachable: starting without knowing that it uses this gateway's store; /readyz fails (control_plane_store) until it answers",
				"control_plane", c.addr, "waited", c.wait, "err", last)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Second, time.Until(deadline))):
		}
	}
}

// run checks again until ctx ends, and calls stop with the refusal when the control
// plane proves another store.
func (c *storeCheck) run(ctx context.Context, stop func(error)) {
	for {
		c.mu.Lock()
		every := c.interval
		if !c.verified {
			every = max(c.interval/10, time.Second)
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		if err := c.once(ctx); err != nil {
			c.log.Error("stopping", "err", err)
			stop(err)
			return
		}
	}
}

// ready is the /readyz check "control_plane_store".
func (c *storeCheck) ready(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.verified {
		return nil
	}
	why := c.last
	if why == nil {
		why = errors.New("not asked yet")
	}
	return fmt.Errorf("not yet known that the control plane (%s) uses this gateway's store: %w", c.addr, why)
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
