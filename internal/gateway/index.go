package gateway

import (
	"slices"
	"strings"
	"sync"
	"time"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// record is what the gateway remembers of a sandbox: who owns it, where it runs, what was
// asked for, and the last status it saw (served once the runner has forgotten it).
type record struct {
	id, org, runnerID string
	spec              *sandboxv1.SandboxSpec
	createdAt         time.Time
	last              runner.Sandbox
}

// index maps sandboxes to their organization and runner, and deduplicates creates.
type index struct {
	mu        sync.Mutex
	byID      map[string]*record
	byRequest map[string]string // org + "\x00" + request_id -> sandbox ID
}

func newIndex() *index {
	return &index{byID: map[string]*record{}, byRequest: map[string]string{}}
}

// get returns the record of id if it belongs to org. Another organization's sandbox is
// reported exactly like a missing one.
func (x *index) get(org, id string) (*record, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r, ok := x.byID[id]
	if !ok || r.org != org {
		return nil, false
	}
	return r, true
}

func (x *index) byRequestID(org, requestID string) (*record, bool) {
	if requestID == "" {
		return nil, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.byRequest[org+"\x00"+requestID]
	if !ok {
		return nil, false
	}
	r, ok := x.byID[id]
	return r, ok
}

func (x *index) put(r *record, requestID string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byID[r.id] = r
	if requestID != "" {
		x.byRequest[r.org+"\x00"+requestID] = r.id
	}
}

func (x *index) setLast(r *record, sb runner.Sandbox) {
	x.mu.Lock()
	r.last = sb
	x.mu.Unlock()
}

func (x *index) lastOf(r *record) runner.Sandbox {
	x.mu.Lock()
	defer x.mu.Unlock()
	return r.last
}

// list returns org's records, oldest first (newest first when desc).
func (x *index) list(org string, desc bool) []*record {
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
func (x *index) forget(cutoff time.Time) {
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
