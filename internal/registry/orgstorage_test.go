package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// offline is an organization bucket nothing listens at (opening one touches no network).
var offline = &s3.Config{Endpoint: "127.0.0.1:1", Bucket: "own", AccessKey: "ak", SecretKey: "sk", Insecure: true, PathStyle: true}

// resolver is a Config.OrgStorage whose answers and failure a test sets.
type resolver struct {
	mu    sync.Mutex
	where map[string]*s3.Config
	err   error
	calls atomic.Int32
	// gate, when set, holds every call (its answer already read) until closed; entered
	// is signaled first.
	gate    chan struct{}
	entered chan struct{}
}

func (rs *resolver) get(_ context.Context, org string) (*s3.Config, error) {
	rs.calls.Add(1)
	rs.mu.Lock()
	gate, entered := rs.gate, rs.entered
	c, err := rs.where[org], rs.err // the answer as of the call's start
	rs.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	}
	return c, err
}

func (rs *resolver) set(f func(*resolver)) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f(rs)
}

// TestOrgStorageResolverDown: after the TTL, a resolver error keeps the last answer in
// use (MANAGED and an own bucket alike); an organization with no answer, or whose answer
// ForgetOrgStorage dropped, gets the error.
func TestOrgStorageResolverDown(t *testing.T) {
	rs := &resolver{where: map[string]*s3.Config{"org-a": offline}}
	f := newFixture(t, Config{OrgStorage: rs.get})
	ctx := context.Background()
	own, err := f.reg.backendFor(ctx, "org-a", false)
	if err != nil || own == f.reg.platform {
		t.Fatalf("org-a: %v, own bucket %v", err, own != f.reg.platform)
	}
	if b, err := f.reg.backendFor(ctx, "org-b", false); err != nil || b != f.reg.platform {
		t.Fatalf("org-b: %v", err)
	}
	// An error that says something about the config (the credentials deleted) ends the
	// answer's use at once.
	rs.set(func(rs *resolver) { rs.err = errors.New("credentials gone") })
	f.now = f.now.Add(2 * DefaultOrgStorageTTL)
	if _, err := f.reg.backendFor(ctx, "org-a", false); err == nil {
		t.Error("org-a with its credentials gone: no error (the last answer was used)")
	}
	rs.set(func(rs *resolver) { rs.err = nil })
	if b, err := f.reg.backendFor(ctx, "org-a", false); err != nil || b == f.reg.platform {
		t.Fatalf("org-a back: %v", err)
	}
	rs.set(func(rs *resolver) { rs.err = fmt.Errorf("%w: store down", ErrOrgStorageTransient) })
	f.now = f.now.Add(2 * DefaultOrgStorageTTL)
	if b, err := f.reg.backendFor(ctx, "org-a", false); err != nil || b != own {
		t.Errorf("org-a read with the store down: %v, same bucket %v", err, b == own)
	}
	if b, err := f.reg.backendFor(ctx, "org-b", false); err != nil || b != f.reg.platform {
		t.Errorf("org-b (MANAGED) read with the store down: %v", err)
	}
	// Another replica may have changed the config: a stale answer takes no write.
	if _, err := f.reg.backendFor(ctx, "org-b", true); err == nil {
		t.Error("org-b write with the store down: no error (a stale answer took a write)")
	}
	if _, err := f.reg.backendFor(ctx, "org-a", true); err == nil {
		t.Error("org-a write with the store down: no error (a stale answer took a write)")
	}
	// Nor any read once it is older than MaxStaleOrgStorage.
	f.now = f.now.Add(MaxStaleOrgStorage)
	if _, err := f.reg.backendFor(ctx, "org-b", false); err == nil {
		t.Error("org-b read, answer older than MaxStaleOrgStorage: no error")
	}
	f.now = f.now.Add(-MaxStaleOrgStorage)
	if _, err := f.reg.backendFor(ctx, "org-c", false); err == nil {
		t.Error("org-c, never answered, with the store down: no error")
	}
	f.reg.ForgetOrgStorage("org-a")
	if _, err := f.reg.backendFor(ctx, "org-a", false); err == nil {
		t.Error("org-a forgotten with the store down: no error (the old answer was used)")
	}
	rs.set(func(rs *resolver) { rs.err = nil; rs.where["org-a"] = nil })
	if b, err := f.reg.backendFor(ctx, "org-a", false); err != nil || b != f.reg.platform {
		t.Errorf("org-a back: %v, platform %v", err, b == f.reg.platform)
	}
}

// TestOrgStorageForgetDuringResolve: an answer asked for before ForgetOrgStorage is
// neither stored nor used; the registry asks again. Concurrent requests share one call.
func TestOrgStorageForgetDuringResolve(t *testing.T) {
	rs := &resolver{where: map[string]*s3.Config{"org-a": offline}, gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	f := newFixture(t, Config{OrgStorage: rs.get})
	type result struct {
		b   *backend
		err error
	}
	out := make(chan result, 4)
	for range 4 {
		go func() {
			b, err := f.reg.backendFor(context.Background(), "org-a", false)
			out <- result{b, err}
		}()
	}
	<-rs.entered // the first call is under way with the old config
	time.Sleep(100 * time.Millisecond)
	if n := rs.calls.Load(); n != 1 {
		t.Errorf("%d concurrent resolver calls, want 1 (shared)", n)
	}
	// The config changes to MANAGED while it runs.
	gate := rs.gate
	rs.set(func(rs *resolver) { rs.where["org-a"] = nil; rs.gate = nil })
	f.reg.ForgetOrgStorage("org-a")
	close(gate)
	for range 4 {
		r := <-out
		if r.err != nil || r.b != f.reg.platform {
			t.Errorf("after the change: %v, platform %v (the old answer was used)", r.err, r.b == f.reg.platform)
		}
	}
	if b, err := f.reg.backendFor(context.Background(), "org-a", false); err != nil || b != f.reg.platform {
		t.Errorf("stored answer: %v, platform %v", err, b == f.reg.platform)
	}
}

// TestOrgStorageOutlivesRequest: an organization's Distribution app is not tied to the
// context of the request that opened it.
func TestOrgStorageOutlivesRequest(t *testing.T) {
	rs := &resolver{where: map[string]*s3.Config{"org-a": offline}}
	f := newFixture(t, Config{OrgStorage: rs.get})
	ctx, cancel := context.WithCancel(context.Background())
	b, err := f.reg.backendFor(ctx, "org-a", false)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := b.app.Err(); err != nil {
		t.Errorf("the app's context ended with the request: %v", err)
	}
}

// TestOrgGCHungEndpoint: the GC pass over an organization's bucket at an endpoint that
// never answers ends at OrgTimeout with an error, and while it waits, another
// organization's pushes (to the platform storage) go through: the pass holds its own
// storage's lock only.
func TestOrgGCHungEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	var conns []net.Conn
	var connsMu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c) // held open, never answered
			connsMu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	hung := *offline
	hung.Endpoint = ln.Addr().String()
	rs := &resolver{where: map[string]*s3.Config{"org-a": &hung}}
	f := newFixture(t, Config{OrgStorage: rs.get})
	const timeout = 3 * time.Second
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := f.reg.GC(context.Background(), GCOptions{OrgStorages: []string{"org-a"}, OrgTimeout: timeout})
		done <- err
	}()
	select {
	case <-accepted: // the pass over org-a's bucket is waiting on it
	case <-time.After(10 * time.Second):
		t.Fatal("the GC never reached org-a's endpoint")
	}
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	pushed := make(chan error, 1)
	go func() { pushed <- remote.Write(f.ref(t, "org-b/app:v1"), img, basic(adminB)) }()
	select {
	case err := <-pushed:
		if err != nil {
			t.Errorf("org-b's push during org-a's GC: %v", err)
		}
	case <-time.After(timeout - 500*time.Millisecond):
		t.Error("org-b's push waited on org-a's GC")
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "org-a") {
			t.Errorf("GC with org-a's endpoint hung: %v, want an error naming org-a", err)
		}
		if d := time.Since(start); d > timeout+5*time.Second {
			t.Errorf("GC took %s, OrgTimeout %s", d, timeout)
		}
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("the GC did not end at OrgTimeout")
	}
}

// TestLockForGCGivesUp: a pass waiting for a storage's lock gives up with its context,
// and new writes are not queued behind it (a write stuck on a hung endpoint holds its
// share; with sync.RWMutex.Lock the pass would wait forever and block every new write).
func TestLockForGCGivesUp(t *testing.T) {
	var mu sync.RWMutex
	mu.RLock() // a write stuck on an unresponsive endpoint
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- lockForGC(ctx, &mu) }()
	time.Sleep(100 * time.Millisecond)
	if !mu.TryRLock() {
		t.Fatal("a new write is queued behind the waiting pass")
	}
	mu.RUnlock()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("lockForGC = %v, want the context's deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lockForGC did not give up with its context")
	}
	mu.RUnlock()
	if err := lockForGC(context.Background(), &mu); err != nil {
		t.Errorf("free lock: %v", err)
	}
}
