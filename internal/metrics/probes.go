package metrics

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ReadyTimeout bounds one /readyz answer's checks.
const ReadyTimeout = 2 * time.Second

type readiness struct {
	name  string
	check func(context.Context) error
}

// SetReady sets the readiness check called name (replacing one of that name): GET
// /readyz answers 200 when every check returns nil, else 503 naming those that failed. A
// process registers its own (the control plane: its store; the gateway: a runner; the
// runner: its backend). Until a process registers one it is not ready.
func (m *Metrics) SetReady(name string, check func(context.Context) error) {
	m.readyMu.Lock()
	defer m.readyMu.Unlock()
	for i := range m.ready {
		if m.ready[i].name == name {
			m.ready[i].check = check
			return
		}
	}
	m.ready = append(m.ready, readiness{name, check})
}

// Ready runs the readiness checks: nil when every one passes (and there is one).
func (m *Metrics) Ready(ctx context.Context) error {
	m.readyMu.Lock()
	checks := append([]readiness(nil), m.ready...)
	m.readyMu.Unlock()
	if len(checks) == 0 {
		return fmt.Errorf("starting")
	}
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	var failed []string
	for _, c := range checks {
		if err := c.check(ctx); err != nil {
			failed = append(failed, c.name+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s", strings.Join(failed, "; "))
	}
	return nil
}

// Readyz is GET /readyz: 200 "ok" when Ready, else 503 with why.
func (m *Metrics) Readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if err := m.Ready(r.Context()); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}

// Livez is GET /livez: 200 "ok" while the process serves HTTP at all (it checks nothing
// else: a dependency's outage makes a process unready, never dead).
func Livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprintln(w, "ok")
}
