package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestStoreOperationMetrics: each statement counts once under its op, and a transaction
// once as tx (its statements not again).
func TestStoreOperationMetrics(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := func(op string) string {
		return `cwsandbox_store_operation_duration_seconds_count{op="` + op + `"}`
	}
	ops := []string{counters.StoreExec, counters.StoreQuery, counters.StoreQueryRow, counters.StoreTx}
	for _, c := range []struct {
		name string
		op   string
		do   func() error
	}{
		{"create (exec)", counters.StoreExec, func() error { _, err := st.Orgs().Create(ctx, store.Org{ID: "org-m", Name: "M"}); return err }},
		{"get (query_row)", counters.StoreQueryRow, func() error { _, err := st.Orgs().Get(ctx, "org-m"); return err }},
		{"list (query)", counters.StoreQuery, func() error { _, err := st.Orgs().List(ctx); return err }},
		{"cluster delete (tx)", counters.StoreTx, func() error { _ = st.Clusters().Delete(ctx, "none"); return nil }},
	} {
		before := counters.Values()
		if err := c.do(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		after := counters.Values()
		for _, op := range ops {
			want := 0.0
			if op == c.op {
				want = 1
			}
			if got := after[key(op)] - before[key(op)]; got != want {
				t.Errorf("%s: %s grew by %v, want %v", c.name, op, got, want)
			}
		}
	}
}
