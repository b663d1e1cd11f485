package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

// EnsureOrg creates organization id unless it exists.
func EnsureOrg(ctx context.Context, st store.Store, id string) error {
	if _, err := st.Orgs().Create(ctx, store.Org{ID: id, Name: id}); err != nil && !errors.Is(err, store.ErrAlreadyExists) {
		return fmt.Errorf("create organization %s: %w", id, err)
	}
	return nil
}

// EnsureAdminKey issues an admin key for org unless it has one that is not revoked. It
// returns the new key's secret, or "" when one existed.
func EnsureAdminKey(ctx context.Context, st store.Store, org string) (string, error) {
	keys, err := st.APIKeys().List(ctx, org)
	if err != nil {
		return "", fmt.Errorf("list API keys: %w", err)
	}
	for _, k := range keys {
		if k.Role == store.RoleAdmin && k.RevokedAt == nil {
			return "", nil
		}
	}
	secret, _, err := auth.IssueKey(ctx, st, org, auth.RoleAdmin, "admin")
	return secret, err
}

// EnsureRunner registers runner r (Org, RunnerID, ClusterID, Zone) with the empty policy
// unless a runner of that id exists. created says whether it did.
func EnsureRunner(ctx context.Context, st store.Store, r store.Runner) (store.Runner, bool, error) {
	cur, err := st.Runners().Get(ctx, r.Org, r.RunnerID)
	if err == nil {
		return cur, false, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Runner{}, false, err
	}
	if r.Policy == nil {
		r.Policy = json.RawMessage(`{}`)
	}
	out, err := st.Runners().Create(ctx, r)
	if errors.Is(err, store.ErrAlreadyExists) {
		// Created concurrently, or its cluster is another runner's.
		if cur, gerr := st.Runners().Get(ctx, r.Org, r.RunnerID); gerr == nil {
			return cur, false, nil
		}
	}
	if err != nil {
		return store.Runner{}, false, fmt.Errorf("register runner %s: %w", r.RunnerID, err)
	}
	return out, true, nil
}

// Status is what one heartbeat reports.
type Status struct {
	Version  string
	Ready    bool
	Capacity Resources
	Usage    Resources
	// Prepull: how the runner's image pre-pull stands; nil when its backend has none.
	Prepull *controlplanev1.PrepullStatus
}

// Beat records one heartbeat of a runner: its status and the time. It leaves the etag
// and the policy alone.
func Beat(ctx context.Context, st store.Store, org, runnerID string, s Status) error {
	capacity, err := json.Marshal(s.Capacity)
	if err != nil {
		return err
	}
	usage, err := json.Marshal(s.Usage)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	prepull, err := prepullJSON(s.Prepull, now)
	if err != nil {
		return err
	}
	return st.Runners().RecordHeartbeat(ctx, org, runnerID, store.RunnerStatus{
		LastHeartbeatAt: &now, Version: s.Version, Ready: s.Ready, Capacity: capacity, Usage: usage, Prepull: prepull,
	})
}

// Heartbeat records the runner's status every interval until ctx ends, starting at once.
// A status failure records nothing (so the runner turns DISCONNECTED after three
// intervals); it and store failures are logged once and retried at the next tick. The
// runner keeps working without the control plane.
func Heartbeat(ctx context.Context, st store.Store, org, runnerID string, interval time.Duration, status func(context.Context) (Status, error), log *slog.Logger) {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		err := func() error {
			c, cancel := context.WithTimeout(ctx, interval)
			defer cancel()
			s, err := status(c)
			if err != nil {
				// Not heard from: no heartbeat, so it turns DISCONNECTED in time.
				return fmt.Errorf("runner status: %w", err)
			}
			return Beat(c, st, org, runnerID, s)
		}()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			log.Warn("runner heartbeat failed", "runner", runnerID, "err", err)
			failing = true
		case err == nil && failing:
			log.Info("runner heartbeat recovered", "runner", runnerID)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PolicySource reads runners' policies from the store for the gateway (it implements
// policy.Source): the policy document as written (nil when never set) and its
// revision (0 when never set). A runner unknown to the store is an error matching
// store.ErrNotFound. When the store fails, the last policy read for that runner is
// returned, so placement goes on with the last-known view while the store is down.
type PolicySource struct {
	st  store.Store
	org string

	mu   sync.Mutex
	last map[string]knownPolicy
}

type knownPolicy struct {
	doc []byte
	rev int64
}

// NewPolicySource returns the policy source of org's runners in st.
func NewPolicySource(st store.Store, org string) *PolicySource {
	return &PolicySource{st: st, org: org, last: map[string]knownPolicy{}}
}

// Policy returns runnerID's policy document and revision (a runner of the source's
// organization).
func (p *PolicySource) Policy(ctx context.Context, runnerID string) ([]byte, int64, error) {
	return p.PolicyOf(ctx, p.org, runnerID)
}

// PolicyOf returns the policy document and revision of runner runnerID of organization
// org (policy.OrgSource): a runner that belongs to another organization than the
// platform's has its policy in that organization's record.
func (p *PolicySource) PolicyOf(ctx context.Context, org, runnerID string) ([]byte, int64, error) {
	r, err := p.st.Runners().Get(ctx, org, runnerID)
	key := org + "/" + runnerID
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.last[key] = knownPolicy{doc: r.Policy, rev: r.PolicyRevision}
		return r.Policy, r.PolicyRevision, nil
	case errors.Is(err, store.ErrNotFound):
		delete(p.last, key)
	default:
		if k, ok := p.last[key]; ok {
			return k.doc, k.rev, nil
		}
	}
	if org != p.org {
		return nil, 0, fmt.Errorf("policy of runner %s of organization %s: %w", runnerID, org, err)
	}
	return nil, 0, fmt.Errorf("policy of runner %s: %w", runnerID, err)
}
