package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// record is what the gateway remembers of a sandbox: who owns it, where it runs, what was
// asked for, and the last status it saw (served once the runner has forgotten it).
type record struct {
	id, org, runnerID string
	spec              *sandboxv1.SandboxSpec
	createdAt         time.Time
	last              runner.Sandbox
	policyRevision    int64
	// requestDigest identifies the request that created the sandbox when its RPC is not
	// CreateSandbox (fileRequestDigest, templateRequestDigest, forkDigest); "" for
	// CreateSandbox. A request_id replayed with another request is a conflict.
	requestDigest string
	// sourceTemplateID and sourceTemplateRevision name the template the sandbox was
	// created from ("" and 0: none).
	sourceTemplateID       string
	sourceTemplateRevision int64
	// displayName is the caller's name for the sandbox (Sandbox.display_name, the
	// display_name of CreateSandboxFromTemplate and CreateSandboxFromFile); a fork
	// carries its source's.
	displayName string
	// builds are the image builds of a CreateSandboxFromFile's services (service ->
	// build ID; GetSandboxBuildLogs); a fork carries its source's.
	builds map[string]string
	// need is what the sandbox holds against its organization's quota (quota.go);
	// reservation, while it is being recorded, the quota reservation it takes its share
	// of (store.Sandbox.ReservationID; "" none).
	need        placement.Resources
	reservation string
}

// index maps sandboxes to their organization and runner, and deduplicates creates. It
// serves from memory and, with a store, writes through on every create and status change
// so that a restarted gateway starts where it left off.
type index struct {
	mu        sync.Mutex
	byID      map[string]*record
	byRequest map[string]string // org + "\x00" + request_id -> sandbox ID
	st        IndexStore        // nil: memory only
	log       *slog.Logger
	// observe, when set, sees every status setLast records (runner health, health.go).
	observe func(*record, runner.Sandbox)
}

func newIndex(st IndexStore, log *slog.Logger) *index {
	return &index{byID: map[string]*record{}, byRequest: map[string]string{}, st: st, log: log}
}

// get returns the record of id if it belongs to org. Another organization's sandbox is
// reported exactly like a missing one. A miss is looked up in the store: another gateway
// replica may have created the sandbox.
func (x *index) get(ctx context.Context, org, id string) (*record, bool) {
	x.mu.Lock()
	r, ok := x.byID[id]
	x.mu.Unlock()
	if ok {
		if r.org != org {
			return nil, false
		}
		return r, true
	}
	if x.st == nil {
		return nil, false
	}
	s, err := x.st.Get(ctx, org, id)
	if err != nil {
		return nil, false
	}
	return x.adopt(s)
}

func (x *index) byRequestID(ctx context.Context, org, requestID string) (*record, bool) {
	if requestID == "" {
		return nil, false
	}
	x.mu.Lock()
	id, ok := x.byRequest[org+"\x00"+requestID]
	r := x.byID[id]
	x.mu.Unlock()
	if ok && r != nil {
		return r, true
	}
	if x.st == nil {
		return nil, false
	}
	s, err := x.st.GetByRequestID(ctx, org, requestID)
	if err != nil {
		return nil, false
	}
	return x.adopt(s)
}

// adopt caches a record read from the store, keeping one already cached.
func (x *index) adopt(s store.Sandbox) (*record, bool) {
	r, err := fromStore(s)
	if err != nil {
		x.log.Warn("read sandbox record", "sandbox", s.ID, "err", err)
		return nil, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur, ok := x.byID[r.id]; ok {
		return cur, true
	}
	x.byID[r.id] = r
	if s.RequestID != "" {
		x.byRequest[r.org+"\x00"+s.RequestID] = r.id
	}
	return r, true
}

// known reports whether the index has a record of id (of any organization) and whether
// that record's sandbox runs on runner runnerID.
func (x *index) known(id, runnerID string) (known, onRunner bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r, ok := x.byID[id]
	return ok, ok && r.runnerID == runnerID
}

func (x *index) put(ctx context.Context, r *record, requestID string) error {
	if err := x.persistNew(ctx, r, requestID); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur, ok := x.byID[r.id]; ok && cur != r && cur.org != r.org {
		// Never another organization's record (a runner answering under its ID).
		return &store.AlreadyExistsError{Entity: "sandbox", Key: store.KeyID}
	}
	x.byID[r.id] = r
	if requestID != "" {
		x.byRequest[r.org+"\x00"+requestID] = r.id
	}
	return nil
}

func (x *index) setLast(ctx context.Context, r *record, sb runner.Sandbox) {
	sb.Usage = nil // a moment's reading: never kept, never shown as the last state
	x.mu.Lock()
	dirty := changed(r.last, sb)
	r.last = sb
	x.mu.Unlock()
	if x.observe != nil {
		x.observe(r, sb) // runner health: the outcome of a create (health.go)
	}
	if dirty {
		if err := x.persistStatus(context.WithoutCancel(ctx), r, sb); err != nil {
			x.log.Warn("record sandbox status", "sandbox", r.id, "err", err)
		}
	}
}

// runnerOf is the runner r runs on now (it changes when the sandbox moves).
func (x *index) runnerOf(r *record) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return r.runnerID
}

// moved records that r now runs on runner to, as sb: in the store first (its runner_id
// and status), then in memory, so every call from now on goes to to. Nothing changes
// when the store refuses.
func (x *index) moved(ctx context.Context, r *record, to string, sb runner.Sandbox) error {
	if x.st != nil {
		u, err := statusUpdate(r, sb)
		if err != nil {
			return err
		}
		u.RunnerID = to
		if _, err := x.st.UpdateStatus(ctx, r.org, r.id, u); err != nil {
			return fmt.Errorf("record sandbox %s on runner %s: %w", r.id, to, err)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	r.runnerID, r.last = to, sb
	return nil
}

// refresh re-reads r's runner from the store (another gateway replica may have moved
// the sandbox) and reports whether it changed.
func (x *index) refresh(ctx context.Context, r *record) bool {
	if x.st == nil {
		return false
	}
	s, err := x.st.Get(ctx, r.org, r.id)
	if err != nil || s.RunnerID == "" {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if s.RunnerID == r.runnerID {
		return false
	}
	r.runnerID = s.RunnerID
	return true
}

func (x *index) lastOf(r *record) runner.Sandbox {
	x.mu.Lock()
	defer x.mu.Unlock()
	return r.last
}

// list returns org's records, oldest first (newest first when desc). With a store it
// first picks up records other gateway replicas created.
func (x *index) list(ctx context.Context, org string, desc bool) []*record {
	if x.st != nil {
		token := ""
		for {
			page, next, err := x.st.List(ctx, org, store.SandboxFilter{IncludeTerminal: true}, store.Page{Size: store.MaxPageSize, Token: token})
			if err != nil {
				x.log.Warn("list sandbox records", "org", org, "err", err)
				break
			}
			for _, s := range page {
				x.adopt(s)
			}
			if next == "" {
				break
			}
			token = next
		}
	}
	x.mu.Lock()
	out := make([]*record, 0, len(x.byID))
	for _, r := range x.byID {
		if r.org == org {
			out = append(out, r)
		}
	}
	x.mu.Unlock()
	slices.SortFunc(out, func(a, b *record) int {
		c := a.createdAt.Compare(b.createdAt)
		if c == 0 {
			c = strings.Compare(a.id, b.id)
		}
		if desc {
			return -c
		}
		return c
	})
	return out
}

// forget drops records of sandboxes that ended before cutoff.
func (x *index) forget(ctx context.Context, cutoff time.Time) {
	if x.st != nil {
		if _, err := x.st.DeleteEndedBefore(ctx, cutoff); err != nil {
			x.log.Warn("drop ended sandboxes from the index", "err", err)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, r := range x.byID {
		if r.last.State.Terminal() && !r.last.EndedAt.IsZero() && r.last.EndedAt.Before(cutoff) {
			delete(x.byID, id)
		}
	}
	for k, id := range x.byRequest {
		if _, ok := x.byID[id]; !ok {
			delete(x.byRequest, k)
		}
	}
}
