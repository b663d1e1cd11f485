package store_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func i64(v int64) *int64 { return &v }

func TestQuotaPutGetDelete(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		q := s.Quotas()
		_, err := q.Get(ctx, "o1")
		wantErr(t, err, store.ErrNotFound)
		put, err := q.Put(ctx, store.Quota{Org: "o1", QuotaLimits: store.QuotaLimits{MaxSandboxes: i64(3), MaxMemoryBytes: i64(store.Unlimited)}, UpdatedBy: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := q.Get(ctx, "o1")
		if err != nil || *got.MaxSandboxes != 3 || got.MaxMilliCPU != nil || *got.MaxMemoryBytes != -1 || got.UpdatedBy != "k1" || !got.UpdatedAt.Equal(put.UpdatedAt) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// Put replaces the whole quota.
		if _, err := q.Put(ctx, store.Quota{Org: "o1", QuotaLimits: store.QuotaLimits{MaxMilliCPU: i64(500)}}); err != nil {
			t.Fatal(err)
		}
		got, _ = q.Get(ctx, "o1")
		if got.MaxSandboxes != nil || *got.MaxMilliCPU != 500 || got.MaxMemoryBytes != nil {
			t.Fatalf("replaced = %+v", got)
		}
		_, err = q.Get(ctx, "o2")
		wantErr(t, err, store.ErrNotFound)
		_, err = q.Put(ctx, store.Quota{Org: "o1", QuotaLimits: store.QuotaLimits{MaxSandboxes: i64(-2)}})
		wantErr(t, err, store.ErrInvalid)
		if err := q.Delete(ctx, "o1"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, q.Delete(ctx, "o1"), store.ErrNotFound)
	})
}

func TestQuotaReserveCountsSandboxesAndReservations(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		q := s.Quotas()
		now := time.Now()
		exp := now.Add(time.Minute)
		// No limit anywhere: nothing is held.
		id, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "r0", Org: "o1", Sandboxes: 1, MilliCPU: 100, ExpiresAt: exp}, store.QuotaLimits{}, now)
		if err != nil || id != "" {
			t.Fatalf("unlimited reserve = %q, %v", id, err)
		}
		// Defaults apply to an organization without a quota.
		def := store.QuotaLimits{MaxSandboxes: i64(2), MaxMilliCPU: i64(1000)}
		id, used, err := q.Reserve(ctx, store.QuotaReservation{ID: "r1", Org: "o1", Sandboxes: 1, MilliCPU: 400, MemoryBytes: 1 << 20, ExpiresAt: exp}, def, now)
		if err != nil || id != "r1" || used.Sandboxes != 0 {
			t.Fatalf("reserve r1 = %q %+v %v", id, used, err)
		}
		// The CPU limit: 400 reserved + 700 > 1000.
		_, _, err = q.Reserve(ctx, store.QuotaReservation{ID: "r2", Org: "o1", Sandboxes: 1, MilliCPU: 700, ExpiresAt: exp}, def, now)
		var qe *store.QuotaExceededError
		if !errors.As(err, &qe) || qe.Quota != store.QuotaMilliCPU || qe.Limit != 1000 || qe.Current != 400 || qe.Asked != 700 || !errors.Is(err, store.ErrQuotaExceeded) {
			t.Fatalf("reserve r2 = %v", err)
		}
		// r1 becomes a sandbox: the count stays 1 (the record takes its share).
		if _, err := s.Sandboxes().Create(ctx, store.Sandbox{ID: "sb1", Org: "o1", RunnerID: "r", State: "CREATING", MilliCPU: 400, MemoryBytes: 1 << 20, ReservationID: "r1"}); err != nil {
			t.Fatal(err)
		}
		u, err := q.Usage(ctx, "o1", now)
		if err != nil || u.Sandboxes != 1 || u.MilliCPU != 400 || u.MemoryBytes != 1<<20 || u.ReservedSandboxes != 0 {
			t.Fatalf("usage after record = %+v %v", u, err)
		}
		// One more slot left, then the sandboxes limit.
		if id, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "r3", Org: "o1", Sandboxes: 1, MilliCPU: 100, ExpiresAt: exp}, def, now); err != nil || id != "r3" {
			t.Fatalf("reserve r3 = %q %v", id, err)
		}
		_, _, err = q.Reserve(ctx, store.QuotaReservation{ID: "r4", Org: "o1", Sandboxes: 1, ExpiresAt: exp}, def, now)
		if !errors.As(err, &qe) || qe.Quota != store.QuotaSandboxes || qe.Limit != 2 || qe.Current != 2 {
			t.Fatalf("reserve r4 = %v", err)
		}
		// Another organization's usage never counts.
		if id, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "o2r", Org: "o2", Sandboxes: 2, ExpiresAt: exp}, def, now); err != nil || id == "" {
			t.Fatalf("o2 reserve = %q %v", id, err)
		}
		// A released reservation frees its slot; an ended sandbox frees its own.
		if err := q.Release(ctx, "o1", "r3"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sandboxes().UpdateStatus(ctx, "o1", "sb1", store.SandboxStatusUpdate{State: "TERMINATED", EndedAt: &now}); err != nil {
			t.Fatal(err)
		}
		u, _ = q.Usage(ctx, "o1", now)
		if u != (store.QuotaUsage{}) {
			t.Fatalf("usage after release and end = %+v", u)
		}
		// The organization's own quota replaces the defaults; -1 is unlimited.
		if _, err := q.Put(ctx, store.Quota{Org: "o1", QuotaLimits: store.QuotaLimits{MaxSandboxes: i64(store.Unlimited), MaxMilliCPU: i64(0)}}); err != nil {
			t.Fatal(err)
		}
		_, _, err = q.Reserve(ctx, store.QuotaReservation{ID: "r5", Org: "o1", Sandboxes: 1, MilliCPU: 1, ExpiresAt: exp}, def, now)
		if !errors.As(err, &qe) || qe.Quota != store.QuotaMilliCPU || qe.Limit != 0 {
			t.Fatalf("reserve r5 = %v", err)
		}
		if id, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "r6", Org: "o1", Sandboxes: 50, ExpiresAt: exp}, def, now); err != nil || id != "r6" {
			t.Fatalf("reserve r6 = %q %v", id, err)
		}
	})
}

// TestQuotaReservationsExpire: a reservation past its time (a gateway that crashed mid
// create) counts no more, and the next reservation drops it.
func TestQuotaReservationsExpire(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		q := s.Quotas()
		now := time.Now()
		def := store.QuotaLimits{MaxSandboxes: i64(1)}
		if _, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "a", Org: "o", Sandboxes: 1, ExpiresAt: now.Add(time.Second)}, def, now); err != nil {
			t.Fatal(err)
		}
		if _, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "b", Org: "o", Sandboxes: 1, ExpiresAt: now.Add(time.Minute)}, def, now); !errors.Is(err, store.ErrQuotaExceeded) {
			t.Fatalf("second reserve before expiry = %v", err)
		}
		later := now.Add(2 * time.Second)
		if u, _ := q.Usage(ctx, "o", later); u.Sandboxes != 0 {
			t.Fatalf("usage after expiry = %+v", u)
		}
		if id, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "b", Org: "o", Sandboxes: 1, ExpiresAt: later.Add(time.Minute)}, def, later); err != nil || id != "b" {
			t.Fatalf("reserve after expiry = %q %v", id, err)
		}
		// A fork's reservation of 3 is taken sandbox by sandbox; the rest released.
		if _, err := q.Put(ctx, store.Quota{Org: "o", QuotaLimits: store.QuotaLimits{MaxSandboxes: i64(4)}}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := q.Reserve(ctx, store.QuotaReservation{ID: "f", Org: "o", Sandboxes: 3, MilliCPU: 300, ExpiresAt: later.Add(time.Minute)}, def, later); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sandboxes().Create(ctx, store.Sandbox{ID: "f1", Org: "o", RunnerID: "r", State: "RUNNING", MilliCPU: 100, ReservationID: "f"}); err != nil {
			t.Fatal(err)
		}
		if u, _ := q.Usage(ctx, "o", later); u.Sandboxes != 4 || u.ReservedSandboxes != 3 || u.MilliCPU != 300 || u.ReservedMilliCPU != 200 {
			t.Fatalf("usage mid fork = %+v", u) // b (1) + f1 (1) + f's 2 left
		}
		if err := q.Release(ctx, "o", "f"); err != nil {
			t.Fatal(err)
		}
		if u, _ := q.Usage(ctx, "o", later); u.Sandboxes != 2 || u.ReservedSandboxes != 1 || u.MilliCPU != 100 {
			t.Fatalf("usage after fork = %+v", u)
		}
	})
}

// TestQuotaReserveRace: many reservations at once, through two stores on one database
// (two gateway replicas), never admit more than the limit.
func TestQuotaReserveRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		a, b := openStore(t, dsn), openStore(t, dsn)
		ctx := t.Context()
		const limit, tries = 5, 40
		def := store.QuotaLimits{MaxSandboxes: i64(limit)}
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for i := range tries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := a
				if i%2 == 1 {
					st = b
				}
				now := time.Now()
				id, _, err := st.Quotas().Reserve(ctx, store.QuotaReservation{ID: fmt.Sprintf("r%d", i), Org: "o", Sandboxes: 1, ExpiresAt: now.Add(time.Minute)}, def, now)
				switch {
				case err == nil && id != "":
					ok.Add(1)
				case errors.Is(err, store.ErrQuotaExceeded):
					refused.Add(1)
				default:
					t.Errorf("reserve %d: %q %v", i, id, err)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != limit || refused.Load() != tries-limit {
			t.Fatalf("admitted %d, refused %d; want %d and %d", ok.Load(), refused.Load(), limit, tries-limit)
		}
	})
}
