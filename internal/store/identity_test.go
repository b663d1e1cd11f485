package store_test

import (
	"sync"
	"testing"
)

// One database has one identity: every opener, concurrent first callers included, reads
// the same, and it survives a reopen; another database has another.
func TestStoreIdentity(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		a, b := openStore(t, dsn), openStore(t, dsn)
		ids := make([]string, 8)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				s := a
				if i%2 == 1 {
					s = b
				}
				id, err := s.Identity(t.Context())
				if err != nil {
					t.Error(err)
				}
				ids[i] = id
			})
		}
		wg.Wait()
		if len(ids[0]) != 64 {
			t.Fatalf("identity %q: want 64 hex digits", ids[0])
		}
		for _, id := range ids[1:] {
			if id != ids[0] {
				t.Fatalf("identities differ: %q", ids)
			}
		}
		a.Close()
		b.Close()
		again, err := openStore(t, dsn).Identity(t.Context())
		if err != nil || again != ids[0] {
			t.Fatalf("after reopen: %q, %v; want %q", again, err, ids[0])
		}
	})
	// Two databases of one backend: two identities.
	for _, be := range backends {
		t.Run(be.name+"/two", func(t *testing.T) {
			x, err := openStore(t, be.newDB(t)).Identity(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			y, err := openStore(t, be.newDB(t)).Identity(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if x == y {
				t.Fatalf("two databases share identity %s", x)
			}
		})
	}
}
