package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

func openStore(t *testing.T, opts image.Options) *image.Store {
	t.Helper()
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	if opts.Insecure == nil {
		opts.Insecure = []string{"127.0.0.1:*"}
	}
	s, err := image.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counter counts requests per method+path at the registry.
type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) hook(r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[r.Method+" "+r.URL.Path]++
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.m {
		n += v
	}
	return n
}

func (c *counter) blobGets() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.m {
		if strings.HasPrefix(k, "GET ") && strings.Contains(k, "/blobs/") {
			out[k] = v
		}
	}
	return out
}

// smallImage is a synthetic two-layer image (no cache tarballs needed).
func smallImage(t testing.TB, tag string) v1.Image {
	t.Helper()
	base, err := testimage.LayerFromFiles(map[string][]byte{"etc/os-release": []byte("ID=test\n"), "bin/tool": []byte("tool")})
	if err != nil {
		t.Fatal(err)
	}
	top, err := testimage.LayerFromFiles(map[string][]byte{"app/" + tag: []byte(tag)})
	if err != nil {
		t.Fatal(err)
	}
	img, err := testimage.ImageFromLayers(image.Config{Cmd: []string{"/bin/tool"}, Env: []string{"A=" + tag}}, base, top)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func startRegistry(t *testing.T, o testimage.RegistryOptions) string {
	t.Helper()
	host, stop, err := testimage.StartRegistryWith(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return host
}

func TestPullStandard(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host, _, _ := testimage.Standard(ctx, t)
	imgs, _ := testimage.StandardImages()
	bbDigest, _ := imgs.Busybox.Digest()
	s := openStore(t, image.Options{})

	t0 := time.Now()
	bb, err := s.Pull(ctx, host+"/"+testimage.Busybox, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox cold pull %v", time.Since(t0))
	if bb.Digest != bbDigest.String() || len(bb.Layers) != 1 {
		t.Fatalf("busybox: digest %s layers %v", bb.Digest, bb.Layers)
	}
	if l, err := os.Readlink(filepath.Join(bb.Layers[0], "bin/sh")); err != nil || l != "/bin/busybox" {
		t.Fatalf("bin/sh -> %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(bb.Layers[0], "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("/tmp not sticky: %v", err)
	}
	if argv, _ := bb.Config.Argv("", nil); strings.Join(argv, " ") != "/bin/sh" {
		t.Fatalf("argv %q", argv)
	}
	if bb.Ref != host+"/"+testimage.Busybox {
		t.Fatalf("ref %q", bb.Ref)
	}
	t0 = time.Now()
	if _, err := s.Pull(ctx, host+"/"+testimage.Busybox, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox warm pull (tag, HEAD) %v", time.Since(t0))

	// by digest
	byDigest, err := s.Pull(ctx, host+"/sandboxd/busybox@"+bbDigest.String(), nil)
	if err != nil || byDigest.Digest != bb.Digest || byDigest.Layers[0] != bb.Layers[0] {
		t.Fatalf("by digest: %+v %v", byDigest, err)
	}

	// multi-arch index picks linux/amd64 (the arm64 entry is listed first)
	multi, err := s.Pull(ctx, host+"/"+testimage.BusyboxMulti, nil)
	if err != nil || multi.Digest != bb.Digest {
		t.Fatalf("multi: %+v %v (want %s)", multi, err, bb.Digest)
	}
	arm := openStore(t, image.Options{Platform: "linux/arm64"})
	if a, err := arm.Pull(ctx, host+"/"+testimage.BusyboxMulti, nil); err != nil || a.Digest == bb.Digest {
		t.Fatalf("arm64 pull: %+v %v", a, err)
	}
	if _, err := arm.Pull(ctx, host+"/"+testimage.Busybox, nil); err != nil {
		t.Logf("single-arch image on arm64 store: %v", err) // a plain manifest is taken as is
	}
	s390 := openStore(t, image.Options{Platform: "linux/s390x"})
	if _, err := s390.Pull(ctx, host+"/"+testimage.BusyboxMulti, nil); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("no matching platform: %v", err)
	}

	// python
	t0 = time.Now()
	py, err := s.Pull(ctx, host+"/"+testimage.Python, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("python cold pull (fetch+gunzip+unpack) %v", time.Since(t0))
	if _, err := os.Stat(filepath.Join(py.Layers[0], "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if _, err := s.Pull(ctx, host+"/"+testimage.Python, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("python warm pull (tag) %v", time.Since(t0))
	t0 = time.Now()
	if _, err := s.Pull(ctx, host+"/sandboxd/python@"+py.Digest, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("python warm pull (digest, no network) %v", time.Since(t0))

	// a reopened store (runner restart) still has everything, by tag without network
	s2 := openStore(t, image.Options{Root: s.Root()})
	if got, err := s2.Lookup(host + "/" + testimage.Python); err != nil || got.Digest != py.Digest {
		t.Fatalf("lookup after reopen: %v", err)
	}
}

func TestPullDedupAndCache(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	var c counter
	host := startRegistry(t, testimage.RegistryOptions{OnRequest: c.hook})
	imgA, imgB := smallImage(t, "a"), smallImage(t, "b") // share the base layer
	dA, err := testimage.Push(host, "x/app:a", imgA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.Push(host, "x/app:b", imgB); err != nil {
		t.Fatal(err)
	}
	c = counter{}
	s := openStore(t, image.Options{})

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := host + "/x/app:a"
			if i%2 == 1 {
				ref = host + "/x/app:b"
			}
			img, err := s.Pull(ctx, ref, nil)
			if err == nil && len(img.Layers) != 2 {
				err = fmt.Errorf("layers %v", img.Layers)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	gets := c.blobGets()
	// 3 layer blobs (shared base + 2 tops) + 2 configs, each fetched exactly once
	if len(gets) != 5 {
		t.Errorf("blob GETs %v, want 5 distinct", gets)
	}
	for k, n := range gets {
		if n != 1 {
			t.Errorf("%s fetched %d times", k, n)
		}
	}

	// a cached tag costs only a HEAD; a cached digest costs nothing
	before := c.total()
	if _, err := s.Pull(ctx, host+"/x/app:a", nil); err != nil {
		t.Fatal(err)
	}
	if n := c.total() - before; n > 2 { // GET /v2/ ping + HEAD manifest
		t.Errorf("cached tag pull made %d requests: %v", n, c.m)
	}
	if len(c.blobGets()) != 5 {
		t.Error("cached tag pull fetched blobs")
	}
	before = c.total()
	if _, err := s.Pull(ctx, host+"/x/app@"+dA, nil); err != nil {
		t.Fatal(err)
	}
	if n := c.total() - before; n != 0 {
		t.Errorf("cached digest pull made %d requests", n)
	}
}

func TestDigestPullOffline(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := testimage.Push(host, "x/app:a", smallImage(t, "a"))
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, image.Options{})
	if _, err := s.Pull(ctx, host+"/x/app@"+d, nil); err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := s.Pull(ctx, host+"/x/app@"+d, nil); err != nil {
		t.Fatalf("cached digest pull with the registry down: %v", err)
	}
	if _, err := s.Pull(ctx, host+"/x/app:a", nil); !errors.Is(err, image.ErrUnreachable) {
		t.Fatalf("tag pull with the registry down: %v", err)
	}
}

func TestPullAuth(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	good := image.Credentials{Username: "alice", Password: "s3cret"}
	bad := image.Credentials{Username: "alice", Password: "nope"}
	for _, mode := range []string{"basic", "bearer"} {
		t.Run(mode, func(t *testing.T) {
			o := testimage.RegistryOptions{BasicAuth: &good}
			if mode == "bearer" {
				o = testimage.RegistryOptions{BearerAuth: &good}
			}
			host := startRegistry(t, o)
			if _, err := testimage.PushAuth(host, "x/app:a", smallImage(t, "a"), &good); err != nil {
				t.Fatal(err)
			}
			ref := host + "/x/app:a"
			cases := []struct {
				name    string
				auth    map[string]image.Credentials
				creds   *image.Credentials
				wantErr error
			}{
				{"anonymous", nil, nil, image.ErrUnauthorized},
				{"wrong per-request", nil, &bad, image.ErrUnauthorized},
				{"wrong config", map[string]image.Credentials{host: bad}, nil, image.ErrUnauthorized},
				{"config", map[string]image.Credentials{host: good}, nil, nil},
				{"per-request", nil, &good, nil},
				{"per-request overrides config", map[string]image.Credentials{host: good}, &bad, image.ErrUnauthorized},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					s := openStore(t, image.Options{Auth: tc.auth})
					_, err := s.Pull(ctx, ref, tc.creds)
					if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
				})
			}
		})
	}
}

func TestPullErrors(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	if _, err := testimage.Push(host, "x/app:a", smallImage(t, "a")); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	cases := []struct {
		name, ref string
		insecure  []string
		want      error
		msg       string
		configure bool // the registry has credentials configured (it is the operator's)
	}{
		{"unknown tag", host + "/x/app:nope", nil, image.ErrNotFound, "", false},
		{"unknown repo", host + "/x/nope:a", nil, image.ErrNotFound, "", false},
		{"unknown digest", host + "/x/app@sha256:" + strings.Repeat("a", 64), nil, image.ErrNotFound, "", false},
		{"closed port", closed + "/x/app:a", nil, image.ErrUnreachable, "", false},
		{"insecure not configured", host + "/x/app:a", []string{"localhost:*"}, image.ErrUnreachable, "not configured as an insecure registry", true},
		{"loopback not configured", host + "/x/app:a", []string{"localhost:*"}, image.ErrRegistryNotAllowed, "", false},
		{"dns", "nonexistent.invalid/x/app:a", nil, image.ErrUnreachable, "", false},
		{"empty", "", nil, image.ErrInvalidReference, "", false},
		{"uppercase repo", host + "/X/App:a", nil, image.ErrInvalidReference, "", false},
		{"space", "busy box", nil, image.ErrInvalidReference, "", false},
		{"bad digest", host + "/x/app@sha256:zz", nil, image.ErrInvalidReference, "", false},
		{"bad tag", host + "/x/app:" + strings.Repeat("t", 200), nil, image.ErrInvalidReference, "", false},
		{"only tag", ":a", nil, image.ErrInvalidReference, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := image.Options{Insecure: tc.insecure}
			if tc.configure {
				opts.Auth = map[string]image.Credentials{host: {Username: "u", Password: "p"}}
			}
			s := openStore(t, opts)
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err := s.Pull(cctx, tc.ref, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want mention of %q", err, tc.msg)
			}
			t.Logf("%v", err)
		})
	}
}

func TestUnpackedLayerSemantics(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	mk := func(entries func(tw *tar.Writer)) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		entries(tw)
		tw.Close()
		l, err := testimage.LayerFromTar(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	reg := func(tw *tar.Writer, name, body string) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	bottom := mk(func(tw *tar.Writer) {
		tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
		reg(tw, "d/old", "old")
		reg(tw, "f", "f")
		tw.WriteHeader(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "f"})
		tw.WriteHeader(&tar.Header{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "f"})
	})
	top := mk(func(tw *tar.Writer) {
		tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
		reg(tw, "d/.wh..wh..opq", "")
		reg(tw, "d/new", "new")
		reg(tw, ".wh.f", "")
	})
	img, err := testimage.ImageFromLayers(image.Config{Cmd: []string{"x"}}, bottom, top)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.Push(host, "x/wh:1", img); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, image.Options{})
	got, err := s.Pull(ctx, host+"/x/wh:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != 2 || !strings.HasPrefix(got.Layers[0], s.Root()) {
		t.Fatalf("layers %v", got.Layers)
	}
	b, t0 := got.Layers[0], got.Layers[1]
	if fi, err := os.Lstat(filepath.Join(t0, "f")); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("whiteout for f: %v %v", fi, err)
	}
	if fi1, _ := os.Stat(filepath.Join(b, "f")); !os.SameFile(fi1, mustStat(t, filepath.Join(b, "h"))) {
		t.Fatal("hard link lost")
	}
	if l, _ := os.Readlink(filepath.Join(b, "s")); l != "f" {
		t.Fatal("symlink lost")
	}
	if _, err := os.Stat(filepath.Join(t0, "d", ".wh..wh..opq")); !os.IsNotExist(err) {
		t.Fatal("opaque marker left as a file")
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func TestUnsafeLayerRejected(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"})
	tw.Close()
	l, _ := testimage.LayerFromTar(buf.Bytes())
	img, _ := testimage.ImageFromLayers(image.Config{Cmd: []string{"x"}}, l)
	if _, err := testimage.Push(host, "x/evil:1", img); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, image.Options{})
	if _, err := s.Pull(ctx, host+"/x/evil:1", nil); !errors.Is(err, image.ErrUnsafeLayer) {
		t.Fatalf("err = %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Root(), "layers", "sha256"))
	tmp, _ := os.ReadDir(filepath.Join(s.Root(), "tmp"))
	if len(ents)+len(tmp) != 0 {
		t.Fatalf("leftovers: %v %v", ents, tmp)
	}
}

func TestGC(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	for _, tag := range []string{"a", "b"} {
		if _, err := testimage.Push(host, "x/app:"+tag, smallImage(t, tag)); err != nil {
			t.Fatal(err)
		}
	}
	s := openStore(t, image.Options{})
	a, err := s.Pull(ctx, host+"/x/app:a", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Pull(ctx, host+"/x/app:b", nil)
	if err != nil {
		t.Fatal(err)
	}
	imgs, layers, err := s.GC(ctx, []string{a.Digest, b.Digest})
	if err != nil || imgs != 0 || layers != 0 {
		t.Fatalf("GC keeping all: %d %d %v", imgs, layers, err)
	}
	imgs, layers, err = s.GC(ctx, []string{a.Digest})
	if err != nil || imgs != 1 || layers != 1 { // b's top layer; the base is shared with a
		t.Fatalf("GC: %d images %d layers %v", imgs, layers, err)
	}
	for _, l := range a.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("in-use layer removed: %v", err)
		}
	}
	if _, err := os.Stat(b.Layers[1]); !os.IsNotExist(err) {
		t.Fatal("unused layer kept")
	}
	if _, err := s.Lookup(host + "/x/app:b"); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("lookup of collected image: %v", err)
	}
	// GC concurrent with pulls: pulls must succeed with all their layers present.
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := range 6 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			img, err := s.Pull(ctx, host+"/x/app:b", nil)
			if err != nil {
				failures.Add(1)
				return
			}
			_ = i
			_ = img
		}()
		go func() {
			defer wg.Done()
			if _, _, err := s.GC(ctx, []string{a.Digest}); err != nil {
				failures.Add(1)
			}
		}()
	}
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d failures", failures.Load())
	}
	imgs, _, err = s.GC(ctx, nil)
	if err != nil || imgs < 1 {
		t.Fatalf("GC all: %d %v", imgs, err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Root(), "layers", "sha256"))
	if len(ents) != 0 {
		t.Fatalf("layers left after GC(nil): %v", ents)
	}
}

// TestGCGrace: an image a Pull just returned survives GC until the grace period has
// passed, even when the caller has not yet reported it in use.
func TestGCGrace(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	host := startRegistry(t, testimage.RegistryOptions{})
	if _, err := testimage.Push(host, "x/app:a", smallImage(t, "a")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		removed int
	}{
		{"within grace", time.Hour, 0},
		{"no grace", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, image.Options{GCGrace: tc.grace})
			img, err := s.Pull(ctx, host+"/x/app:a", nil)
			if err != nil {
				t.Fatal(err)
			}
			imgs, _, err := s.GC(ctx, nil)
			if err != nil || imgs != tc.removed {
				t.Fatalf("GC removed %d images (%v), want %d", imgs, err, tc.removed)
			}
			for _, l := range img.Layers {
				if _, err := os.Stat(l); (err == nil) != (tc.removed == 0) {
					t.Errorf("layer %s: stat %v with %d images removed", l, err, tc.removed)
				}
			}
		})
	}
}

// TestPullCachedPrivateDigest: an image pulled with a caller's own credentials is served
// from the cache by digest only after the registry confirms the next caller's access:
// anonymous and wrong credentials are refused although the runner holds the image, good
// credentials and a public image's anonymous digest pull are served (a public image
// needs no network once cached).
func TestPullCachedPrivateDigest(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	ctx := context.Background()
	good := image.Credentials{Username: "alice", Password: "s3cret"}
	bad := image.Credentials{Username: "alice", Password: "nope"}
	host := startRegistry(t, testimage.RegistryOptions{BasicAuth: &good})
	digest, err := testimage.PushAuth(host, "x/app:a", smallImage(t, "a"), &good)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	s := openStore(t, image.Options{Root: root})
	if _, err := s.Pull(ctx, host+"/x/app:a", &good); err != nil {
		t.Fatal(err)
	}
	byDigest := host + "/x/app@" + digest
	if _, err := s.Pull(ctx, byDigest, nil); !errors.Is(err, image.ErrUnauthorized) {
		t.Fatalf("anonymous pull of a cached private image by digest: err = %v, want ErrUnauthorized", err)
	}
	if _, err := s.Pull(ctx, byDigest, &bad); !errors.Is(err, image.ErrUnauthorized) {
		t.Fatalf("wrong credentials, cached private image by digest: err = %v, want ErrUnauthorized", err)
	}
	if _, err := s.Pull(ctx, byDigest, &good); err != nil {
		t.Fatalf("good credentials, cached private image by digest: %v", err)
	}
	// Reopened (a restarted runner): the mark is kept in the index.
	s2 := openStore(t, image.Options{Root: root})
	if _, err := s2.Pull(ctx, byDigest, nil); !errors.Is(err, image.ErrUnauthorized) {
		t.Fatalf("after reopen, anonymous pull of a cached private image by digest: err = %v, want ErrUnauthorized", err)
	}
}
