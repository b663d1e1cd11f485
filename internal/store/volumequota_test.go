package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func vol(org, id string, size int64) store.Volume {
	return store.Volume{Org: org, ID: id, RunnerID: "r1", Namespace: "default", ClaimName: id, State: "VALIDATING", SizeBytes: size}
}

// TestVolumeBytesQuota: Create and Resize admit against max_volume_bytes (the
// organization's, else the default), count every volume whatever its state, and a delete
// frees its bytes; Usage reports volumes and their bytes.
func TestVolumeBytesQuota(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		vs := s.Volumes()
		def := &store.QuotaLimits{MaxVolumeBytes: i64(10 << 30)}
		if _, err := vs.Create(ctx, vol("acme", "a", 6<<30), 0, def); err != nil {
			t.Fatal(err)
		}
		_, err := vs.Create(ctx, vol("acme", "b", 5<<30), 0, def)
		var qe *store.QuotaExceededError
		if !errors.As(err, &qe) || qe.Quota != store.QuotaVolumeBytes || qe.Limit != 10<<30 || qe.Current != 6<<30 || qe.Asked != 5<<30 {
			t.Fatalf("create past the default = %v (%+v)", err, qe)
		}
		if _, err := vs.Get(ctx, "acme", "b"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("refused volume stored: %v", err)
		}
		// The organization's own limit overrides the default; -1 lifts it.
		if _, err := s.Quotas().Put(ctx, store.Quota{Org: "acme", QuotaLimits: store.QuotaLimits{MaxVolumeBytes: i64(12 << 30)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := vs.Create(ctx, vol("acme", "b", 5<<30), 0, def); err != nil {
			t.Fatal(err)
		}
		// Without a quota check (nil) nothing is refused; another organization is apart.
		if _, err := vs.Create(ctx, vol("globex", "a", 9<<30), 0, def); err != nil {
			t.Fatal(err)
		}
		// Resize: only grows; admitted against the limit by the growth.
		if _, _, err := vs.Resize(ctx, "acme", "a", 5<<30, def); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("shrink = %v", err)
		}
		if _, _, err := vs.Resize(ctx, "acme", "a", 8<<30, def); !errors.As(err, &qe) || qe.Current != 11<<30 || qe.Asked != 2<<30 {
			t.Fatalf("grow past = %v", err)
		}
		before, after, err := vs.Resize(ctx, "acme", "a", 7<<30, def)
		if err != nil || before.SizeBytes != 6<<30 || after.SizeBytes != 7<<30 {
			t.Fatalf("grow = %+v %+v %v", before, after, err)
		}
		if _, _, err := vs.Resize(ctx, "acme", "nope", 7<<30, def); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("resize missing = %v", err)
		}
		u, err := s.Quotas().Usage(ctx, "acme", time.Now())
		if err != nil || u.Volumes != 2 || u.VolumeBytes != 12<<30 {
			t.Fatalf("usage = %+v, %v", u, err)
		}
		if _, err := vs.Delete(ctx, "acme", "b"); err != nil {
			t.Fatal(err)
		}
		if _, err := vs.Create(ctx, vol("acme", "c", 5<<30), 0, def); err != nil {
			t.Fatalf("after a delete freed bytes: %v", err)
		}
		// Snapshot limits round-trip.
		q, err := s.Quotas().Put(ctx, store.Quota{Org: "acme", QuotaLimits: store.QuotaLimits{MaxSnapshots: i64(3), MaxSnapshotBytes: i64(store.Unlimited)}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Quotas().Get(ctx, "acme")
		if err != nil || *got.MaxSnapshots != 3 || *got.MaxSnapshotBytes != -1 || got.MaxVolumeBytes != nil || q.Org != "acme" {
			t.Fatalf("get = %+v, %v", got, err)
		}
		if _, err := s.Quotas().Put(ctx, store.Quota{Org: "acme", QuotaLimits: store.QuotaLimits{MaxVolumeBytes: i64(-2)}}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("put -2 = %v", err)
		}
	})
}

// TestVolumeBytesRace: creates racing through two stores on one database (two gateway
// replicas) on the last bytes never pass max_volume_bytes.
func TestVolumeBytesRace(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		a, b := openStore(t, dsn), openStore(t, dsn)
		ctx := t.Context()
		const limit, tries = 5, 30
		// Room for 5 GiB and the small volumes made before they grow.
		def := &store.QuotaLimits{MaxVolumeBytes: i64(limit<<30 + tries<<20)}
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
				var err error
				if i%3 == 0 && i > 0 {
					// Growing races too: a volume made small, then grown by 1 GiB.
					id := fmt.Sprintf("g%d", i)
					if _, err = st.Volumes().Create(ctx, vol("o", id, 1<<20), 0, nil); err == nil {
						_, _, err = st.Volumes().Resize(ctx, "o", id, 1<<20+1<<30, def)
						if err != nil {
							_, _ = st.Volumes().Delete(ctx, "o", id)
						}
					}
				} else {
					_, err = st.Volumes().Create(ctx, vol("o", fmt.Sprintf("v%d", i), 1<<30), 0, def)
				}
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, store.ErrQuotaExceeded):
					refused.Add(1)
				default:
					t.Errorf("create %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		u, err := a.Quotas().Usage(ctx, "o", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if ok.Load() != limit || refused.Load() != tries-limit || u.VolumeBytes > *def.MaxVolumeBytes {
			t.Fatalf("admitted %d, refused %d, %d bytes; want %d and %d", ok.Load(), refused.Load(), u.VolumeBytes, limit, tries-limit)
		}
	})
}

// TestSecretReseal: the rotation primitives: usage per key, the rows not under a key in
// pages, and a compare-and-swap reseal that leaves a value put meanwhile alone.
func TestSecretReseal(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		ss := s.SecretStores()
		for _, org := range []string{"acme", "globex"} {
			if _, err := ss.Create(ctx, store.SecretStore{Org: org, Name: "prod"}, 0); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if _, err := ss.PutSecret(ctx, store.Secret{Org: org, Store: "prod", Path: fmt.Sprintf("p%d", i), KeyID: "old", Ciphertext: []byte("c" + org)}, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		use, err := ss.KeyUsage(ctx)
		if err != nil || len(use) != 1 || use["old"] != 6 {
			t.Fatalf("usage = %v, %v", use, err)
		}
		var all []store.Secret
		var after *store.Secret
		for {
			page, err := ss.SealedNotUnder(ctx, "new", after, 4)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			all = append(all, page...)
			after = &page[len(page)-1]
		}
		if len(all) != 6 || all[0].Org != "acme" || all[5].Org != "globex" || !bytes.Equal(all[0].Ciphertext, []byte("cacme")) {
			t.Fatalf("sealed = %+v", all)
		}
		// A value put after the listing is not overwritten.
		if _, err := ss.PutSecret(ctx, store.Secret{Org: "acme", Store: "prod", Path: "p0", KeyID: "old", Ciphertext: []byte("fresh")}, 0); err != nil {
			t.Fatal(err)
		}
		for i, x := range all {
			did, err := ss.Reseal(ctx, x, "new", []byte("n"+x.Org))
			if err != nil || did != (i != 0) {
				t.Fatalf("reseal %d = %v, %v", i, did, err)
			}
		}
		use, _ = ss.KeyUsage(ctx)
		if use["old"] != 1 || use["new"] != 5 {
			t.Fatalf("usage after = %v", use)
		}
		x, err := ss.GetSecret(ctx, "globex", "prod", "p1", "")
		if err != nil || x.KeyID != "new" || string(x.Ciphertext) != "nglobex" {
			t.Fatalf("get = %+v, %v", x, err)
		}
	})
}
