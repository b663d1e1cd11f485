package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	v2 "github.com/distribution/distribution/v3/registry/api/v2"
	"golang.org/x/sync/singleflight"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// An organization's own storage (build storage mode CUSTOMER_OWNED, docs/builds.md):
// Config.OrgStorage names an S3 bucket for an organization, and every request on that
// organization's repositories ("<org>/…") is served by a Distribution app on that bucket
// (objects under S3Prefix, like the platform's S3 storage). The organization is the
// authenticated caller's (a request for another organization's repository is refused
// before storage is chosen), so a caller only ever reaches its own organization's
// storage.
//
// Reads fall back: a manifest GET/HEAD or a blob GET that the organization's bucket
// answers 404 is served from the platform storage, so images pushed before the switch
// stay pullable (until the platform's GC collects them, when nothing names them). A
// blob HEAD does not fall back: a push asks it to learn whether to upload, and the blob
// must be in the bucket the manifest is written to. Nothing falls back from the platform
// storage to a bucket: after a switch back to MANAGED (or to another bucket), the
// images in the old bucket are not served.

// Defaults of the organizations' storages.
const (
	DefaultOrgStorageTTL  = 30 * time.Second
	DefaultMaxOrgStorages = 256
)

// orgResolveTimeout bounds one OrgStorage call (shared by the requests waiting on it).
const orgResolveTimeout = 15 * time.Second

// MaxStaleOrgStorage bounds how long after its last check an answer may still serve reads
// while OrgStorage fails transiently.
const MaxStaleOrgStorage = 10 * DefaultOrgStorageTTL

// ErrOrgStorageTransient marks an OrgStorage error that says nothing about the
// organization's config (its store cannot be read now): the last answer may keep serving
// reads. Any other error (the credentials deleted, the endpoint no longer allowed) ends
// its use at once.
var ErrOrgStorageTransient = errors.New("the organization's build storage cannot be checked now")

type orgStorages struct {
	mu   sync.Mutex
	tick uint64
	m    map[string]*orgStorage
	// gen is bumped by ForgetOrgStorage: an answer asked for before is not kept.
	gen map[string]uint64
	// flight joins the concurrent OrgStorage calls of an organization (and generation).
	flight singleflight.Group
}

// orgStorage is an organization's answer from OrgStorage: b nil for the platform
// storage.
type orgStorage struct {
	fp      string // fingerprint of the config b was opened with
	b       *backend
	checked time.Time
	used    uint64
	// forgotten: ForgetOrgStorage was called since (the config changed): never served
	// again, not even while OrgStorage fails.
	forgotten bool
}

// fingerprint identifies c (the credentials hashed in, never kept in clear here).
func fingerprint(c *s3.Config) string {
	h := sha256.New()
	for _, f := range []string{c.Endpoint, c.Bucket, c.Region, c.AccessKey, c.SecretKey, fmt.Sprint(c.PathStyle, c.Insecure)} {
		_, _ = fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ForgetOrgStorage drops what OrgStorage answered for org: the next request asks again
// (the gateway calls it when the organization's build storage config changes), and an
// answer asked for before this call is not kept.
func (r *Registry) ForgetOrgStorage(org string) {
	r.orgs.mu.Lock()
	defer r.orgs.mu.Unlock()
	r.orgs.gen[org]++
	if e, ok := r.orgs.m[org]; ok {
		e.forgotten = true
	}
}

// backendFor is the storage of org's repositories; write says whether the request
// writes or deletes there.
//
// An answer is used for OrgStorageTTL. When OrgStorage then fails transiently
// (ErrOrgStorageTransient: the store is down), the last answer keeps serving reads for at
// most MaxStaleOrgStorage (logged): another gateway replica may have changed the config
// meanwhile, so a stale answer never takes a write (it could land the organization's
// images in a storage that is no longer its own), and this registry's own
// ForgetOrgStorage makes it unusable at once. Any other error (the credentials deleted,
// the endpoint no longer allowed), and no answer at all, is a 503.
func (r *Registry) backendFor(ctx context.Context, org string, write bool) (*backend, error) {
	if r.cfg.OrgStorage == nil {
		return r.platform, nil
	}
	o := &r.orgs
	// An answer asked for before a ForgetOrgStorage is not stored: ask again (a few times
	// at most, for configs changing without pause).
	for range 3 {
		now := r.cfg.now()
		o.mu.Lock()
		o.tick++
		e, ok := o.m[org]
		if ok && !e.forgotten && now.Sub(e.checked) < r.cfg.OrgStorageTTL {
			e.used = o.tick
			o.mu.Unlock()
			return e.orPlatform(r), nil
		}
		gen := o.gen[org]
		o.mu.Unlock()

		v, err, _ := o.flight.Do(org+"\x00"+strconv.FormatUint(gen, 10), func() (any, error) {
			// Not the first request's context: the others wait on the same call.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), orgResolveTimeout)
			defer cancel()
			return r.cfg.OrgStorage(ctx, org)
		})
		c, _ := v.(*s3.Config)

		o.mu.Lock()
		if o.gen[org] != gen {
			o.mu.Unlock()
			continue
		}
		if err != nil {
			e, ok := o.m[org]
			if !ok || e.forgotten || write || !errors.Is(err, ErrOrgStorageTransient) || now.Sub(e.checked) > MaxStaleOrgStorage {
				o.mu.Unlock()
				return nil, err
			}
			e.used = o.tick
			o.mu.Unlock()
			r.cfg.Logger.Warn("registry: cannot check the organization's build storage: using the last answer", "org", org, "err", err)
			return e.orPlatform(r), nil
		}
		b, err := r.storeOrgStorage(org, c, now)
		o.mu.Unlock()
		return b, err
	}
	return nil, errors.New("the organization's build storage config keeps changing")
}

// storeOrgStorage records c, OrgStorage's answer for org (o.mu held).
func (r *Registry) storeOrgStorage(org string, c *s3.Config, now time.Time) (*backend, error) {
	o := &r.orgs
	fp := ""
	if c != nil {
		fp = fingerprint(c)
	}
	if e, ok := o.m[org]; ok && e.fp == fp {
		e.checked, e.used, e.forgotten = now, o.tick, false
		return e.orPlatform(r), nil
	}
	var b *backend
	if c != nil {
		typ, params, err := s3Params(c)
		if err != nil {
			return nil, err
		}
		// Opening touches no network (the driver connects on use). The app lives as long
		// as the registry, not the request that opened it.
		if b, err = openBackend(r.ctx, typ, params, r.uploadSecret); err != nil {
			return nil, err
		}
	}
	if old, ok := o.m[org]; ok && old.b != nil {
		// In-flight requests may still use it: its app's background work stops, its
		// driver keeps serving them.
		_ = old.b.app.Shutdown()
	}
	o.m[org] = &orgStorage{fp: fp, b: b, checked: now, used: o.tick}
	for len(o.m) > r.cfg.MaxOrgStorages {
		lru, least := "", uint64(0)
		for k, v := range o.m {
			if lru == "" || v.used < least {
				lru, least = k, v.used
			}
		}
		if v := o.m[lru]; v.b != nil {
			_ = v.b.app.Shutdown()
		}
		delete(o.m, lru)
	}
	if b == nil {
		return r.platform, nil
	}
	return b, nil
}

func (e *orgStorage) orPlatform(r *Registry) *backend {
	if e.b == nil {
		return r.platform
	}
	return e.b
}

func (o *orgStorages) closeAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, v := range o.m {
		if v.b != nil {
			_ = v.b.app.Shutdown()
		}
		delete(o.m, k)
	}
}

// readsImage reports whether a request reads an image (manifest GET/HEAD, blob GET): one
// that falls back to the platform storage.
func readsImage(method, route string) bool {
	switch route {
	case v2.RouteNameManifest:
		return method == http.MethodGet || method == http.MethodHead
	case v2.RouteNameBlob:
		return method == http.MethodGet
	}
	return false
}

// serveUnlessMissing serves req with h unless h answers 404: then nothing is written to w
// and it returns false.
func serveUnlessMissing(w http.ResponseWriter, req *http.Request, h http.Handler) bool {
	pw := &probeWriter{w: w, h: http.Header{}}
	h.ServeHTTP(pw, req)
	if !pw.wrote {
		pw.WriteHeader(http.StatusOK)
	}
	return !pw.miss
}

// probeWriter passes a response through unless its status is 404, which it swallows.
type probeWriter struct {
	w           http.ResponseWriter
	h           http.Header
	wrote, miss bool
}

func (p *probeWriter) Header() http.Header { return p.h }

func (p *probeWriter) WriteHeader(code int) {
	if p.wrote {
		return
	}
	p.wrote = true
	if code == http.StatusNotFound {
		p.miss = true
		return
	}
	for k, v := range p.h {
		p.w.Header()[k] = v
	}
	p.w.WriteHeader(code)
}

func (p *probeWriter) Write(b []byte) (int, error) {
	if !p.wrote {
		p.WriteHeader(http.StatusOK)
	}
	if p.miss {
		return len(b), nil
	}
	return p.w.Write(b)
}
