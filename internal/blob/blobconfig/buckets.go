package blobconfig

import (
	"context"
	"errors"
	"sync"

	"github.com/sandboxd/sandboxd/internal/blob"
)

// DefaultMaxBuckets bounds the stores of other buckets a Buckets keeps open.
const DefaultMaxBuckets = 64

// Buckets hands out the store of a bucket by name: the platform store (its own bucket,
// or "") or, when the platform store is S3, a store for another bucket of the same
// endpoint and credentials (an organization's own snapshot bucket; WithBucket), opened on
// first use and kept, at most max of them (the least recently used is dropped). The
// runner (where it writes and reads archives) and the gateway (where it checks and
// deletes them) use one each. Safe for concurrent use.
type Buckets struct {
	base     Config
	platform blob.Store
	max      int
	// open opens a store of another bucket (Config.Open; tests replace it).
	open func(ctx context.Context, c Config) (blob.Store, error)

	mu     sync.Mutex
	tick   uint64
	stores map[string]*bucketStore
}

type bucketStore struct {
	st   blob.Store
	used uint64
}

// NewBuckets is the Buckets of platform, the store base opened (base may be the zero
// Config when only platform is known: then no other bucket is reachable). max <= 0 is
// DefaultMaxBuckets.
func NewBuckets(base Config, platform blob.Store, max int) *Buckets {
	if max <= 0 {
		max = DefaultMaxBuckets
	}
	return &Buckets{base: base, platform: platform, max: max, stores: map[string]*bucketStore{},
		open: func(ctx context.Context, c Config) (blob.Store, error) { return c.Open(ctx) }}
}

// Platform is the platform store's bucket (Config.Bucket: "local" for a directory store).
func (b *Buckets) Platform() string {
	if b.base.S3 == nil && b.base.Dir == "" {
		return "local"
	}
	return b.base.Bucket()
}

// Store is the store of bucket: the platform store for "" or the platform's bucket;
// otherwise a store of that bucket with the platform's endpoint and credentials.
// Errors: ErrNoOtherBucket (the platform store is not S3), an invalid bucket name, and
// what opening it returns (s3.ErrNoSuchBucket when it does not exist); a failed open is
// not kept.
func (b *Buckets) Store(ctx context.Context, bucket string) (blob.Store, error) {
	if bucket == "" || bucket == b.Platform() {
		if b.platform == nil {
			return nil, errors.New("blob store: none configured")
		}
		return b.platform, nil
	}
	if b.base.S3 == nil {
		return nil, ErrNoOtherBucket
	}
	b.mu.Lock()
	b.tick++
	if e, ok := b.stores[bucket]; ok {
		e.used = b.tick
		b.mu.Unlock()
		return e.st, nil
	}
	b.mu.Unlock()
	cfg, err := b.base.WithBucket(bucket, "")
	if err != nil {
		return nil, err
	}
	st, err := b.open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tick++
	if e, ok := b.stores[bucket]; ok { // opened meanwhile by another caller
		e.used = b.tick
		return e.st, nil
	}
	for len(b.stores) >= b.max {
		var oldest string
		var at uint64
		for name, e := range b.stores {
			if oldest == "" || e.used < at {
				oldest, at = name, e.used
			}
		}
		delete(b.stores, oldest)
	}
	b.stores[bucket] = &bucketStore{st: st, used: b.tick}
	return st, nil
}

// Len is how many stores of other buckets are kept open.
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.stores)
}
