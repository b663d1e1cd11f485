// Package blobtest is the conformance suite every blob.Store implementation passes.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
)

// Options tunes the suite for one implementation.
type Options struct {
	// Tamper alters key's stored content (same length, one byte flipped) behind the
	// store's back; the suite then expects Get's reader to fail with blob.ErrCorrupt.
	Tamper func(t *testing.T, key string)
	// LargeSize is the size of the streamed large object (0: 64 MiB; -short: 8 MiB).
	LargeSize int64
}

// Run runs the suite against a fresh, empty store from newStore (called once per subtest).
func Run(t *testing.T, newStore func(t *testing.T) blob.Store, opts Options) {
	ctx := context.Background()
	t.Run("PutGetStat", func(t *testing.T) {
		s := newStore(t)
		data := []byte("hello blob")
		info, err := s.Put(ctx, "a/b/c.txt", bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		want := sha(data)
		if info.Key != "a/b/c.txt" || info.Size != int64(len(data)) || info.SHA256 != want {
			t.Errorf("Put info %+v, want size %d sha %s", info, len(data), want)
		}
		if got := get(t, s, "a/b/c.txt"); !bytes.Equal(got, data) {
			t.Errorf("Get = %q, want %q", got, data)
		}
		st, err := s.Stat(ctx, "a/b/c.txt")
		if err != nil || st.Size != int64(len(data)) || st.SHA256 != want || st.Key != "a/b/c.txt" {
			t.Errorf("Stat = %+v, %v", st, err)
		}
		// Replace, with unknown size.
		data2 := []byte("second version, longer")
		if _, err := s.Put(ctx, "a/b/c.txt", bytes.NewReader(data2), -1); err != nil {
			t.Fatal(err)
		}
		if got := get(t, s, "a/b/c.txt"); !bytes.Equal(got, data2) {
			t.Errorf("Get after replace = %q", got)
		}
		// Empty object; a key that is both an object and a "directory".
		if _, err := s.Put(ctx, "a/b", strings.NewReader(""), 0); err != nil {
			t.Fatal(err)
		}
		if got := get(t, s, "a/b"); len(got) != 0 {
			t.Errorf("empty object = %q", got)
		}
	})
	t.Run("SizeMismatch", func(t *testing.T) {
		s := newStore(t)
		for _, size := range []int64{3, 10} {
			_, err := s.Put(ctx, "k", strings.NewReader("12345"), size)
			if !errors.Is(err, blob.ErrSizeMismatch) {
				t.Errorf("Put 5 bytes declared %d: %v, want ErrSizeMismatch", size, err)
			}
		}
		if _, err := s.Stat(ctx, "k"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("a failed Put left an object: Stat = %v", err)
		}
	})
	t.Run("NotFound", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.Get(ctx, "missing/x"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Get: %v", err)
		}
		if _, err := s.Stat(ctx, "missing"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Stat: %v", err)
		}
		if err := s.Delete(ctx, "missing"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Delete: %v", err)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		s := newStore(t)
		put(t, s, "d/x", "1")
		put(t, s, "d/y", "2")
		if err := s.Delete(ctx, "d/x"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, "d/x"); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Stat after Delete: %v", err)
		}
		if got := get(t, s, "d/y"); string(got) != "2" {
			t.Errorf("sibling = %q", got)
		}
	})
	t.Run("List", func(t *testing.T) {
		s := newStore(t)
		keys := []string{"a", "a/b", "a/b/c", "a/bc", "a-b", "b/x", "a/b-d/e"}
		for _, k := range keys {
			put(t, s, k, "v:"+k)
		}
		for prefix, want := range map[string][]string{
			"":     {"a", "a-b", "a/b", "a/b-d/e", "a/b/c", "a/bc", "b/x"},
			"a":    {"a", "a-b", "a/b", "a/b-d/e", "a/b/c", "a/bc"},
			"a/":   {"a/b", "a/b-d/e", "a/b/c", "a/bc"},
			"a/b":  {"a/b", "a/b-d/e", "a/b/c", "a/bc"},
			"a/b/": {"a/b/c"},
			"b/x":  {"b/x"},
			"c":    nil,
		} {
			var got []string
			for info, err := range s.List(ctx, prefix) {
				if err != nil {
					t.Fatalf("List(%q): %v", prefix, err)
				}
				if info.Size != int64(len("v:"+info.Key)) || info.SHA256 != sha([]byte("v:"+info.Key)) {
					t.Errorf("List(%q): %+v", prefix, info)
				}
				got = append(got, info.Key)
			}
			if !slices.Equal(got, want) {
				t.Errorf("List(%q) = %q, want %q", prefix, got, want)
			}
		}
		for _, bad := range []string{"/a", "../", "a//b", "a/../b"} {
			n := 0
			for _, err := range s.List(ctx, bad) {
				n++
				if !errors.Is(err, blob.ErrInvalidKey) {
					t.Errorf("List(%q): %v, want ErrInvalidKey", bad, err)
				}
			}
			if n != 1 {
				t.Errorf("List(%q) yielded %d, want one error", bad, n)
			}
		}
	})
	t.Run("InvalidKeys", func(t *testing.T) {
		s := newStore(t)
		for _, k := range []string{"", "/a", "a/", "..", "../x", "a/../b", "a//b", ".hidden", "a/.b", "a b", "a\x00b", "é", strings.Repeat("k", blob.MaxKeyLen+1)} {
			if _, err := s.Put(ctx, k, strings.NewReader("x"), 1); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Put(%q): %v", k, err)
			}
			if _, err := s.Get(ctx, k); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Get(%q): %v", k, err)
			}
			if _, err := s.Stat(ctx, k); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Stat(%q): %v", k, err)
			}
			if err := s.Delete(ctx, k); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Delete(%q): %v", k, err)
			}
		}
	})
	t.Run("Large", func(t *testing.T) {
		s := newStore(t)
		size := opts.LargeSize
		if size == 0 {
			size = 64 << 20
			if testing.Short() {
				size = 8 << 20
			}
		}
		for _, declared := range []int64{size, -1} {
			g := &gen{left: size}
			peak := watchHeap()
			info, err := s.Put(ctx, "large/obj", g, declared)
			if grew := peak(); size >= 64<<20 && grew > size/2 {
				t.Errorf("Put of %d bytes grew the heap by %d: not streamed", size, grew)
			}
			if err != nil {
				t.Fatalf("Put %d bytes (declared %d): %v", size, declared, err)
			}
			want := hex.EncodeToString(g.h.Sum(nil))
			if info.Size != size || info.SHA256 != want {
				t.Errorf("Put info %+v, want %d %s", info, size, want)
			}
			r, err := s.Get(ctx, "large/obj")
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			n, err := io.Copy(h, r)
			r.Close()
			if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != want {
				t.Errorf("Get: %d bytes, %v; want %d", n, err, size)
			}
		}
	})
	if opts.Tamper != nil {
		t.Run("Tamper", func(t *testing.T) {
			s := newStore(t)
			put(t, s, "t/obj", "the original content")
			opts.Tamper(t, "t/obj")
			r, err := s.Get(ctx, "t/obj")
			if err != nil {
				if !errors.Is(err, blob.ErrCorrupt) {
					t.Fatalf("Get: %v, want ErrCorrupt", err)
				}
				return
			}
			defer r.Close()
			if _, err := io.ReadAll(r); !errors.Is(err, blob.ErrCorrupt) {
				t.Errorf("reading a tampered object: %v, want ErrCorrupt", err)
			}
		})
	}
}

// watchHeap samples the live heap until the returned func is called, which returns the
// largest growth seen over the start.
func watchHeap() func() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := int64(ms.HeapAlloc)
	var peak atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if d := int64(ms.HeapAlloc) - base; d > peak.Load() {
				peak.Store(d)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(stop); <-done; return peak.Load() }
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func put(t *testing.T, s blob.Store, key, v string) {
	t.Helper()
	if _, err := s.Put(context.Background(), key, strings.NewReader(v), int64(len(v))); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func get(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("Get(%q): read: %v", key, err)
	}
	return b
}

// gen yields left pseudo-random bytes without holding them, hashing what it gives.
type gen struct {
	left  int64
	state uint64
	h     hash.Hash
}

func (g *gen) Read(p []byte) (int, error) {
	if g.h == nil {
		g.h = sha256.New()
		g.state = 0x9e3779b97f4a7c15
	}
	if g.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	for i := range p {
		g.state ^= g.state << 13
		g.state ^= g.state >> 7
		g.state ^= g.state << 17
		p[i] = byte(g.state)
	}
	g.h.Write(p)
	g.left -= int64(len(p))
	return len(p), nil
}
