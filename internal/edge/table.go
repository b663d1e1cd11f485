package edge

import (
	"fmt"
	"sync"
)

// Table is an in-memory Routes the runner keeps up to date with Set and Delete. The zero
// Table is empty and ready. Safe for concurrent use.
type Table struct {
	mu sync.RWMutex
	m  map[tableKey]Route
	by map[string][]int // sandbox ID → its ports, for Set and Delete
}

type tableKey struct {
	sandboxID string
	port      int
}

// Set replaces all routes of sandboxID with routes (none: like Delete). Every route must
// be valid, belong to sandboxID and have a port of its own; on error nothing changes.
func (t *Table) Set(sandboxID string, routes []Route) error {
	seen := make(map[int]bool, len(routes))
	for _, r := range routes {
		if r.SandboxID != sandboxID {
			return fmt.Errorf("edge: route for sandbox %q set under sandbox %q", r.SandboxID, sandboxID)
		}
		if err := r.Validate(); err != nil {
			return err
		}
		if seen[r.Port] {
			return fmt.Errorf("edge: sandbox %s: port %d has two routes", sandboxID, r.Port)
		}
		seen[r.Port] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deleteLocked(sandboxID)
	if len(routes) == 0 {
		return nil
	}
	if t.m == nil {
		t.m, t.by = make(map[tableKey]Route), make(map[string][]int)
	}
	ports := make([]int, 0, len(routes))
	for _, r := range routes {
		t.m[tableKey{sandboxID, r.Port}] = r
		ports = append(ports, r.Port)
	}
	t.by[sandboxID] = ports
	return nil
}

// Delete removes every route of sandboxID.
func (t *Table) Delete(sandboxID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deleteLocked(sandboxID)
}

func (t *Table) deleteLocked(sandboxID string) {
	for _, p := range t.by[sandboxID] {
		delete(t.m, tableKey{sandboxID, p})
	}
	delete(t.by, sandboxID)
}

// Lookup implements Routes.
func (t *Table) Lookup(sandboxID string, port int) (Route, bool) {
	t.mu.RLock()
	r, ok := t.m[tableKey{sandboxID, port}]
	t.mu.RUnlock()
	return r, ok
}
