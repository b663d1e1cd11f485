package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestFSSBucketConfigs(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		bc := s.FSSBucketConfigs()
		_, err := bc.Get(ctx, "acme")
		wantErr(t, err, store.ErrNotFound)

		before := time.Now().Add(-time.Second)
		c, err := bc.Put(ctx, store.FSSBucketConfig{Org: "acme", Bucket: "acme-fss", Region: "us-east-1"})
		if err != nil || c.UpdatedAt.Before(before) {
			t.Fatalf("put = %+v, %v", c, err)
		}
		got, err := bc.Get(ctx, "acme")
		if err != nil || got.Bucket != "acme-fss" || got.Region != "us-east-1" || !got.UpdatedAt.Equal(c.UpdatedAt) {
			t.Fatalf("get = %+v, %v; want %+v", got, err, c)
		}
		// Replace; another organization's config is its own.
		if _, err := bc.Put(ctx, store.FSSBucketConfig{Org: "acme", Bucket: "acme-fss-2"}); err != nil {
			t.Fatal(err)
		}
		if _, err := bc.Put(ctx, store.FSSBucketConfig{Org: "globex", Bucket: "globex-fss", Region: "eu-west-1"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := bc.Get(ctx, "acme"); got.Bucket != "acme-fss-2" || got.Region != "" {
			t.Errorf("replaced = %+v", got)
		}
		if got, _ := bc.Get(ctx, "globex"); got.Bucket != "globex-fss" {
			t.Errorf("globex = %+v", got)
		}

		// A bucket is one organization's.
		_, err = bc.Put(ctx, store.FSSBucketConfig{Org: "acme", Bucket: "globex-fss"})
		wantKey(t, err, "bucket_name")
		if got, _ := bc.Get(ctx, "acme"); got.Bucket != "acme-fss-2" {
			t.Errorf("after a refused put = %+v", got)
		}

		_, err = bc.Put(ctx, store.FSSBucketConfig{Org: "acme"})
		wantErr(t, err, store.ErrInvalid)
		_, err = bc.Put(ctx, store.FSSBucketConfig{Bucket: "b"})
		wantErr(t, err, store.ErrInvalid)
		_, err = bc.Put(ctx, store.FSSBucketConfig{Org: "acme", Bucket: strings.Repeat("b", 64)})
		wantErr(t, err, store.ErrInvalid)

		if err := bc.Delete(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		_, err = bc.Get(ctx, "acme")
		wantErr(t, err, store.ErrNotFound)
		if err := bc.Delete(ctx, "acme"); err != nil {
			t.Errorf("deleting no config: %v", err)
		}
		if got, _ := bc.Get(ctx, "globex"); got.Bucket != "globex-fss" {
			t.Errorf("globex after acme's delete = %+v", got)
		}
	})
}
