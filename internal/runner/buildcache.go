package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Layer caches: each organization's builds share one Buildah storage (its layer cache,
// /var/lib/containers in the builder), a kept volume of the runner's backend
// (runtime.Volume.Keep: on the local backend a quota'd btrfs subvolume of its volume
// pool) that outlives the builder. Its name is derived from a hash of the organization
// ID, never the ID itself; different organizations never share one. One build at a time
// uses an organization's cache (buildLocks; a second build of the same organization
// waits, within its own timeout). The runner keeps at most BuildCaches of them: before a
// build makes a new one, the least recently used idle ones beyond that are removed. So
// the caches hold at most BuildCaches × BuildCacheBytes of the pool.

// Build cache defaults.
const (
	DefaultBuildCacheBytes = 10 << 30
	DefaultBuildCaches     = 16
	// BuildCacheMount is where the cache is mounted in the builder: Buildah's storage
	// (graphroot /var/lib/containers/storage, the builder image's storage.conf).
	BuildCacheMount = "/var/lib/containers"
	// buildCachePrefix marks the runner's build caches among the backend's kept volumes.
	buildCachePrefix = "bc-"
)

// BuildCacheName is the kept volume name of organization org's layer cache: a prefix
// and the first 160 bits of the ID's SHA-256 in hex (never the caller's string).
func BuildCacheName(org string) string {
	sum := sha256.Sum256([]byte(org))
	return buildCachePrefix + hex.EncodeToString(sum[:20])
}

// keyedLock is a mutex per key whose waiters honour their context.
type keyedLock struct {
	mu   sync.Mutex
	held map[string]chan struct{} // closed when released
}

// lock takes key, waiting while another holder has it, or fails with ctx's error.
func (k *keyedLock) lock(ctx context.Context, key string) (unlock func(), err error) {
	for {
		k.mu.Lock()
		ch, busy := k.held[key]
		if !busy {
			if k.held == nil {
				k.held = map[string]chan struct{}{}
			}
			ch = make(chan struct{})
			k.held[key] = ch
			k.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					k.mu.Lock()
					delete(k.held, key)
					k.mu.Unlock()
					close(ch)
				})
			}, nil
		}
		k.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// isHeld says whether key is locked now.
func (k *keyedLock) isHeld(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.held[key]
	return ok
}

// buildCache is the kept-volume store of the runner's backend and the cache's quota, or
// why builds run without a cache.
func (l *Local) buildCache() (runtime.KeptVolumes, int64, string) {
	size := l.BuildCacheBytes
	switch {
	case size < 0:
		return nil, 0, "the runner keeps no layer caches (--build-cache-size 0)"
	case size == 0:
		size = DefaultBuildCacheBytes
	}
	kv, ok := l.R.backend.(runtime.KeptVolumes)
	if !ok {
		return nil, 0, "the runner's backend keeps no volumes past their sandbox"
	}
	if why := kv.KeepUnavailable(); why != "" {
		return nil, 0, why
	}
	return kv, size, ""
}

// evictBuildCaches removes the least recently used idle build caches until fewer than
// the runner's bound remain besides keep (the cache about to be used).
func (l *Local) evictBuildCaches(kv runtime.KeptVolumes, keep string) error {
	most := l.BuildCaches
	if most <= 0 {
		most = DefaultBuildCaches
	}
	all, err := kv.ListKept()
	if err != nil {
		return err
	}
	var others []runtime.KeptVolume // least recently used first
	for _, k := range all {
		if strings.HasPrefix(k.Name, buildCachePrefix) && k.Name != keep {
			others = append(others, k)
		}
	}
	excess := len(others) - (most - 1)
	for _, k := range others {
		if excess <= 0 {
			break
		}
		if k.InUse || l.buildLocks.isHeld(k.Name) {
			continue // busy: the bound is exceeded until it is idle
		}
		if err := kv.RemoveKept(k.Name); err != nil {
			return fmt.Errorf("evict build cache %s: %w", k.Name, err)
		}
		excess--
	}
	return nil
}

// endOrphanBuilders deletes the live sandboxes that mount build cache name and waits
// for their end. The caller holds the cache's lock, so they are no build's of this
// process.
func (l *Local) endOrphanBuilders(name string) {
	for _, sb := range l.R.List() {
		if sb.State.Terminal() || !slices.ContainsFunc(sb.Spec.Volumes, func(v runtime.Volume) bool { return v.Keep == name }) {
			continue
		}
		if _, err := l.R.Delete(sb.Spec.ID, 0); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), builderTeardown)
			_, _ = l.R.WaitTerminal(ctx, sb.Spec.ID)
			cancel()
		}
	}
}
