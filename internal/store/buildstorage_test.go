package store_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestBuildStorageConfigs(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		bc := s.BuildStorageConfigs()
		_, err := bc.Get(ctx, "acme")
		wantErr(t, err, store.ErrNotFound)

		// The first write is at revision 0 and makes revision 1.
		c, err := bc.Put(ctx, store.BuildStorageConfig{Org: "acme", Enabled: false, Mode: 1, BillingReference: "cc-42", RegistryNamespace: "reg/acme"}, 0)
		if err != nil || c.Revision != 1 || c.UpdateTime.IsZero() {
			t.Fatalf("put = %+v, %v", c, err)
		}
		got, err := bc.Get(ctx, "acme")
		if err != nil || got.Enabled || got.Mode != 1 || got.BillingReference != "cc-42" || got.RegistryNamespace != "reg/acme" || got.Revision != 1 || !got.UpdateTime.Equal(c.UpdateTime) {
			t.Fatalf("get = %+v, %v", got, err)
		}
		// A write pinned to another revision conflicts and changes nothing.
		if _, err := bc.Put(ctx, store.BuildStorageConfig{Org: "acme", Enabled: true}, 0); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second create: %v", err)
		}
		if _, err := bc.Put(ctx, store.BuildStorageConfig{Org: "acme", Enabled: true}, 7); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("stale revision: %v", err)
		}
		c, err = bc.Put(ctx, store.BuildStorageConfig{Org: "acme", Enabled: true, Bucket: "b", Location: "l"}, 1)
		if err != nil || c.Revision != 2 {
			t.Fatalf("update = %+v, %v", c, err)
		}
		got, _ = bc.Get(ctx, "acme")
		if !got.Enabled || got.Bucket != "b" || got.Location != "l" || got.BillingReference != "" || got.Revision != 2 {
			t.Fatalf("after update = %+v", got)
		}
		// Another organization has its own row.
		_, err = bc.Get(ctx, "globex")
		wantErr(t, err, store.ErrNotFound)
		if _, err := bc.Put(ctx, store.BuildStorageConfig{Org: "globex", Enabled: true}, 1); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("another org's revision: %v", err)
		}
		// Bounds.
		if _, err := bc.Put(ctx, store.BuildStorageConfig{}, 0); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("no org: %v", err)
		}
		if _, err := bc.Put(ctx, store.BuildStorageConfig{Org: "globex", BillingReference: strings.Repeat("x", 257)}, 0); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("too long: %v", err)
		}

		// Concurrent writers at one revision: exactly one wins.
		var wg sync.WaitGroup
		wins := make(chan int64, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c, err := bc.Put(ctx, store.BuildStorageConfig{Org: "acme", Enabled: true}, 2); err == nil {
					wins <- c.Revision
				} else if !errors.Is(err, store.ErrConflict) {
					t.Errorf("concurrent put: %v", err)
				}
			}()
		}
		wg.Wait()
		close(wins)
		if n := len(wins); n != 1 {
			t.Fatalf("%d concurrent writers won, want 1", n)
		}
	})
}
