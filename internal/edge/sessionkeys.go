package edge

import (
	"context"
	"strings"
	"sync"
	"time"
)

// sessionKeyCacheTTL is how long the edge trusts an answer of Config.KeyActive: a revoked
// key's login sessions end within it.
const sessionKeyCacheTTL = 5 * time.Second

// maxKeyCache bounds the answers kept; past it the cache starts over.
const maxKeyCache = 10000

type keyAnswer struct {
	active bool
	at     time.Time
}

// keyCache remembers Config.KeyActive's answers for sessionKeyCacheTTL.
type keyCache struct {
	mu sync.Mutex
	m  map[string]keyAnswer // org + "/" + key id
}

// keyActive reports whether the key of a session is still active for org.
func (e *Edge) keyActive(ctx context.Context, keyID, org string) bool {
	if e.cfg.KeyActive == nil {
		return true
	}
	if keyID == "" {
		return false // a session of a key without ID cannot be re-checked
	}
	k, now := org+"/"+keyID, time.Now()
	c := &e.keyCache
	c.mu.Lock()
	a, ok := c.m[k]
	c.mu.Unlock()
	if ok && now.Sub(a.at) < sessionKeyCacheTTL {
		return a.active
	}
	active := e.cfg.KeyActive(ctx, keyID, org) == nil
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxKeyCache {
		c.m = map[string]keyAnswer{}
	}
	c.m[k] = keyAnswer{active: active, at: now}
	c.mu.Unlock()
	return active
}

// keyIDOf is the ID part of an API key sbx_<id>_<secret> (what a session records of the
// key that made it), or "" for a key of another shape.
func keyIDOf(key string) string {
	rest, ok := strings.CutPrefix(key, "sbx_")
	if !ok {
		return ""
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || id == "" || secret == "" || strings.ContainsAny(id, "|.") {
		return ""
	}
	return id
}
