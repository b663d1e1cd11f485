package image_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// reg is an in-process registry with a request counter.
type reg struct {
	host string
	c    *counter
}

func countedRegistry(t *testing.T, o testimage.RegistryOptions) reg {
	t.Helper()
	c := &counter{}
	inner := o.OnRequest
	o.OnRequest = func(r *http.Request) {
		c.hook(r)
		if inner != nil {
			inner(r)
		}
	}
	return reg{host: startRegistry(t, o), c: c}
}

func (c *counter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = nil
}

func push(t *testing.T, host, repoTag string, img v1.Image) string {
	t.Helper()
	d, err := testimage.Push(host, repoTag, img)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func pullCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// loopbackOnly is a base transport that refuses (and counts) every dial to a
// non-loopback address, so no test can reach the real Docker Hub.
func loopbackOnly(external *atomic.Int32) http.RoundTripper {
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				external.Add(1)
				return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("test transport: non-loopback dial to %s refused", addr)}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
}

func TestMirrorHit(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	up := countedRegistry(t, testimage.RegistryOptions{})
	mir := countedRegistry(t, testimage.RegistryOptions{})
	img := smallImage(t, "same")
	want := push(t, up.host, "x/app:a", img)
	push(t, mir.host, "x/app:a", img)
	up.c.reset()
	mir.c.reset()

	s := openStore(t, image.Options{Mirrors: map[string][]image.Mirror{up.host: {{Host: mir.host}}}})
	ref := up.host + "/x/app:a"
	got, err := s.Pull(pullCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ref != ref || got.Digest != want {
		t.Fatalf("got ref %q digest %s, want %q %s", got.Ref, got.Digest, ref, want)
	}
	if up.c.total() != 0 || mir.c.total() == 0 {
		t.Fatalf("requests: upstream %v mirror %v", up.c.m, mir.c.m)
	}
	// Cached and tagged under the original reference, not the mirror's.
	if l, err := s.Lookup(ref); err != nil || l.Digest != want {
		t.Fatalf("lookup original: %v %v", l, err)
	}
	if _, err := s.Lookup(mir.host + "/x/app:a"); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("lookup by mirror name: %v", err)
	}
	// Re-resolving the tag and pulling by digest also stay on the mirror.
	if again, err := s.Pull(pullCtx(t), ref, nil); err != nil || again.Digest != want {
		t.Fatalf("re-pull: %v %v", again, err)
	}
	s2 := openStore(t, image.Options{Mirrors: map[string][]image.Mirror{up.host: {{Host: mir.host}}}})
	byDigest := up.host + "/x/app@" + want
	if d, err := s2.Pull(pullCtx(t), byDigest, nil); err != nil || d.Digest != want || d.Ref != byDigest {
		t.Fatalf("pull by digest via mirror: %+v %v", d, err)
	}
	if up.c.total() != 0 {
		t.Fatalf("upstream contacted: %v", up.c.m)
	}
	// The same digest when the upstream serves it.
	s3 := openStore(t, image.Options{})
	if d, err := s3.Pull(pullCtx(t), ref, nil); err != nil || d.Digest != want {
		t.Fatalf("upstream pull: %+v %v", d, err)
	}
}

func TestMirrorFallthroughAndOrder(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	imgU, imgA, imgB := smallImage(t, "upstream"), smallImage(t, "a"), smallImage(t, "b")
	cases := []struct {
		name    string
		mirrors []string // "empty", "closed", "A", "B"
		want    string   // which served: "U", "A", "B"
		silent  []string // registries that must see no request
	}{
		{"miss falls back", []string{"empty"}, "U", nil},
		{"unreachable falls back", []string{"closed"}, "U", nil},
		{"miss then unreachable then hit", []string{"empty", "closed", "B"}, "B", []string{"U"}},
		{"first hit wins", []string{"A", "B"}, "A", []string{"U", "B"}},
		{"order respected", []string{"B", "A"}, "B", []string{"U", "A"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			regs := map[string]reg{"U": countedRegistry(t, testimage.RegistryOptions{})}
			digests := map[string]string{"U": push(t, regs["U"].host, "x/app:t", imgU)}
			var ms []image.Mirror
			for _, k := range tc.mirrors {
				switch k {
				case "closed":
					ms = append(ms, image.Mirror{Host: closedAddr(t)})
				case "empty":
					r := countedRegistry(t, testimage.RegistryOptions{})
					ms = append(ms, image.Mirror{Host: r.host})
				default:
					r := countedRegistry(t, testimage.RegistryOptions{})
					regs[k] = r
					src := map[string]v1.Image{"A": imgA, "B": imgB}[k]
					digests[k] = push(t, r.host, "x/app:t", src)
					ms = append(ms, image.Mirror{Host: r.host})
				}
			}
			for _, r := range regs {
				r.c.reset()
			}
			s := openStore(t, image.Options{Mirrors: map[string][]image.Mirror{regs["U"].host: ms}})
			ref := regs["U"].host + "/x/app:t"
			got, err := s.Pull(pullCtx(t), ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Digest != digests[tc.want] || got.Ref != ref {
				t.Fatalf("got %s (%s), want image from %s %s", got.Digest, got.Ref, tc.want, digests[tc.want])
			}
			for _, k := range tc.silent {
				if n := regs[k].c.total(); n != 0 {
					t.Fatalf("%s saw %d requests: %v", k, n, regs[k].c.m)
				}
			}
			if l, err := s.Lookup(ref); err != nil || l.Digest != got.Digest {
				t.Fatalf("lookup: %v %v", l, err)
			}
		})
	}
}

func TestMirrorAllFail(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	creds := image.Credentials{Username: "u", Password: "p"}
	cases := []struct {
		name     string
		upstream testimage.RegistryOptions
		creds    *image.Credentials
		want     error // nil: success from the upstream
	}{
		{"not found anywhere", testimage.RegistryOptions{}, nil, image.ErrNotFound},
		{"upstream auth failure reported", testimage.RegistryOptions{BasicAuth: &creds}, &image.Credentials{Username: "u", Password: "wrong"}, image.ErrUnauthorized},
		{"upstream credentials not sent to mirrors", testimage.RegistryOptions{BasicAuth: &creds}, &creds, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := startRegistry(t, tc.upstream)
			if tc.want == nil {
				if _, err := testimage.PushAuth(up, "x/app:t", smallImage(t, "u"), &creds); err != nil {
					t.Fatal(err)
				}
			}
			var sawAuth atomic.Int32
			empty := countedRegistry(t, testimage.RegistryOptions{OnRequest: func(r *http.Request) {
				if r.Header.Get("Authorization") != "" {
					sawAuth.Add(1)
				}
			}})
			closed := closedAddr(t)
			s := openStore(t, image.Options{Mirrors: map[string][]image.Mirror{up: {{Host: closed}, {Host: empty.host}}}})
			_, err := s.Pull(pullCtx(t), up+"/x/app:t", tc.creds)
			if sawAuth.Load() != 0 {
				t.Fatalf("mirror received credentials")
			}
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			for _, h := range []string{"mirror " + closed, "mirror " + empty.host, "then " + up} {
				if !strings.Contains(err.Error(), h) {
					t.Fatalf("error does not name %q: %v", h, err)
				}
			}
			if empty.c.total() == 0 {
				t.Fatal("second mirror not tried")
			}
			t.Log(err)
		})
	}
}

func TestMirrorDockerHub(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	mir := countedRegistry(t, testimage.RegistryOptions{})
	want := push(t, mir.host, "library/busybox:latest", smallImage(t, "bb"))
	for _, key := range []string{"docker.io", "index.docker.io", "registry-1.docker.io"} {
		t.Run(key, func(t *testing.T) {
			var external atomic.Int32
			s := openStore(t, image.Options{
				Insecure:  []string{}, // plain HTTP only through the mirror's own flag
				Mirrors:   map[string][]image.Mirror{key: {{Host: mir.host, Insecure: true}}},
				Transport: loopbackOnly(&external),
			})
			for _, ref := range []string{"busybox", "library/busybox:latest", "docker.io/library/busybox", "index.docker.io/library/busybox:latest", "busybox@" + want} {
				got, err := s.Pull(pullCtx(t), ref, nil)
				if err != nil {
					t.Fatalf("%s: %v", ref, err)
				}
				wantRef := "index.docker.io/library/busybox:latest"
				if strings.Contains(ref, "@") {
					wantRef = "index.docker.io/library/busybox@" + want
				}
				if got.Digest != want || got.Ref != wantRef {
					t.Fatalf("%s: got %s %s", ref, got.Ref, got.Digest)
				}
			}
			if n := external.Load(); n != 0 {
				t.Fatalf("%d non-loopback dials", n)
			}
			// A miss at the mirror goes on to Docker Hub (refused here) and says so.
			_, err := s.Pull(pullCtx(t), "nosuch:1", nil)
			if !errors.Is(err, image.ErrUnreachable) || !strings.Contains(err.Error(), "mirror "+mir.host) || !strings.Contains(err.Error(), "index.docker.io") {
				t.Fatalf("miss: %v", err)
			}
			if external.Load() == 0 {
				t.Fatal("upstream not tried after the mirror missed")
			}
		})
	}
}

// The official client's default image python:3.11 served by a docker.io mirror
// holding the standard images under their Docker Hub names.
func TestMirrorDockerHubStandardImages(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	imgs, err := testimage.StandardImages()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	mir := countedRegistry(t, testimage.RegistryOptions{})
	if err := testimage.PushDockerHubNames(mir.host, imgs); err != nil {
		t.Fatal(err)
	}
	var external atomic.Int32
	s := openStore(t, image.Options{
		Mirrors:   map[string][]image.Mirror{"docker.io": {{Host: mir.host, Insecure: true}}},
		Transport: loopbackOnly(&external),
	})
	for ref, img := range map[string]v1.Image{"python:3.11": imgs.Python, "busybox": imgs.Busybox} {
		want, _ := img.Digest()
		got, err := s.Pull(pullCtx(t), ref, nil)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if got.Digest != want.String() {
			t.Fatalf("%s: digest %s, want %s", ref, got.Digest, want)
		}
	}
	if external.Load() != 0 {
		t.Fatal("Docker Hub contacted")
	}
}

func TestMirrorInsecurePerMirror(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	up := countedRegistry(t, testimage.RegistryOptions{})
	mir := countedRegistry(t, testimage.RegistryOptions{})
	fromUp := push(t, up.host, "x/app:t", smallImage(t, "u"))
	fromMir := push(t, mir.host, "x/app:t", smallImage(t, "m"))
	cases := []struct {
		name     string
		insecure bool
		want     string
		silent   reg
	}{
		{"secure mirror over plain HTTP refused, falls back", false, fromUp, mir},
		{"insecure mirror used", true, fromMir, up},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []reg{up, mir} {
				r.c.reset()
			}
			s := openStore(t, image.Options{
				Insecure: []string{up.host}, // the mirror host is not insecure by itself
				Mirrors:  map[string][]image.Mirror{up.host: {{Host: mir.host, Insecure: tc.insecure}}},
			})
			got, err := s.Pull(pullCtx(t), up.host+"/x/app:t", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Digest != tc.want {
				t.Fatalf("digest %s, want %s", got.Digest, tc.want)
			}
			if n := tc.silent.c.total(); n != 0 {
				t.Fatalf("%s saw %d requests", tc.silent.host, n)
			}
			// The mirror's flag does not make the host insecure for direct references.
			_, err = s.Pull(pullCtx(t), mir.host+"/x/app:t", nil)
			if !errors.Is(err, image.ErrUnreachable) || !strings.Contains(err.Error(), "not configured as an insecure registry") {
				t.Fatalf("direct pull from mirror host: %v", err)
			}
		})
	}
}

func TestMirrorOptionsValidation(t *testing.T) {
	ok := []image.Mirror{{Host: "127.0.0.1:5000"}}
	cases := []struct {
		name    string
		mirrors map[string][]image.Mirror
		wantErr bool
	}{
		{"valid", map[string][]image.Mirror{"docker.io": ok, "ghcr.io": ok}, false},
		{"scheme in key", map[string][]image.Mirror{"https://docker.io": ok}, true},
		{"path in key", map[string][]image.Mirror{"docker.io/library": ok}, true},
		{"empty mirror host", map[string][]image.Mirror{"docker.io": {{Host: ""}}}, true},
		{"scheme in mirror host", map[string][]image.Mirror{"docker.io": {{Host: "http://127.0.0.1:5000"}}}, true},
		{"path in mirror host", map[string][]image.Mirror{"docker.io": {{Host: "127.0.0.1:5000/prefix"}}}, true},
		{"docker.io twice", map[string][]image.Mirror{"docker.io": ok, "index.docker.io": ok}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := image.Open(image.Options{Root: t.TempDir(), Mirrors: tc.mirrors})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}
