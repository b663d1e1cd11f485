package registry

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/sandboxd/sandboxd/internal/auth"
)

// keys is an Authenticator of fixed keys.
type keys map[string]auth.Principal

func (k keys) Authenticate(key string) (auth.Principal, error) {
	if p, ok := k[key]; ok {
		return p, nil
	}
	return auth.Principal{}, auth.ErrInvalidKey
}

const (
	adminA = "sbx_a1_admin"
	userA  = "sbx_a2_user"
	adminB = "sbx_b1_admin"
)

var testKeys = keys{
	adminA: {KeyID: "a1", Org: "org-a", Role: auth.RoleAdmin},
	userA:  {KeyID: "a2", Org: "org-a", Role: auth.RoleUser},
	adminB: {KeyID: "b1", Org: "org-b", Role: auth.RoleAdmin},
}

type fixture struct {
	reg  *Registry
	srv  *httptest.Server
	host string
	now  time.Time
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{now: time.Now()}
	if cfg.Dir == "" && cfg.S3 == nil {
		cfg.Dir = t.TempDir()
	}
	cfg.Auth = testKeys
	cfg.TokenKey = []byte(strings.Repeat("k", 32))
	cfg.now = func() time.Time { return f.now }
	f.srv = httptest.NewUnstartedServer(nil)
	f.srv.Start()
	f.host = strings.TrimPrefix(f.srv.URL, "http://")
	cfg.Host = f.host
	reg, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.reg = reg
	f.srv.Config.Handler = reg
	t.Cleanup(func() { f.srv.Close(); reg.Close() })
	return f
}

func (f *fixture) ref(t *testing.T, repo string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(f.host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func basic(secret string) remote.Option {
	return remote.WithAuth(&authn.Basic{Username: "x", Password: secret})
}

func bearer(secret string) remote.Option {
	return remote.WithAuth(&authn.Bearer{Token: secret})
}

func push(t *testing.T, f *fixture, repo string, opt remote.Option) v1.Image {
	t.Helper()
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(f.ref(t, repo), img, opt); err != nil {
		t.Fatalf("push %s: %v", repo, err)
	}
	return img
}

// status is the HTTP status of a go-containerregistry error (0 if none).
func status(err error) int {
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode
	}
	return 0
}

func TestPushPullRoundTrip(t *testing.T) {
	f := newFixture(t, Config{})
	img := push(t, f, "org-a/app:v1", basic(adminA))
	want, _ := img.Digest()
	for _, opt := range []remote.Option{basic(adminA), basic(userA), bearer(userA)} {
		got, err := remote.Image(f.ref(t, "org-a/app:v1"), opt)
		if err != nil {
			t.Fatalf("pull: %v", err)
		}
		d, _ := got.Digest()
		if d != want {
			t.Fatalf("pulled %s, pushed %s", d, want)
		}
		layers, _ := got.Layers()
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			_ = rc.Close()
		}
	}
	tok, err := f.reg.MintPullToken("org-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(tok)); err != nil {
		t.Fatalf("pull with a pull token: %v", err)
	}
	push(t, f, "org-a/built:v1", bearer(mustPushToken(t, f, "org-a")))
}

func mustPushToken(t *testing.T, f *fixture, org string) string {
	tok, err := f.reg.MintPushToken(org, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestOrganizationsAreIsolated(t *testing.T) {
	f := newFixture(t, Config{})
	img := push(t, f, "org-a/app:v1", basic(adminA))
	d, _ := img.Digest()
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	tokB, _ := f.reg.MintPullToken("org-b", time.Minute)
	for _, opt := range []remote.Option{basic(adminB), basic(tokB), basic(mustPushToken(t, f, "org-b"))} {
		_, err := remote.Image(f.ref(t, "org-a/app:v1"), opt)
		if status(err) != http.StatusNotFound {
			t.Fatalf("org B pulling org A's image: %v, want 404", err)
		}
		// A repository that does not exist answers the same.
		_, err2 := remote.Image(f.ref(t, "org-a/nothing:v1"), opt)
		if status(err2) != http.StatusNotFound {
			t.Fatalf("org B pulling a missing image: %v, want 404", err2)
		}
	}
	// Raw requests: blobs, tags, manifests by digest, a push, a cross-repository mount.
	for _, c := range []struct{ method, path string }{
		{"GET", "/v2/org-a/app/manifests/" + d.String()},
		{"HEAD", "/v2/org-a/app/blobs/" + ld.String()},
		{"GET", "/v2/org-a/app/tags/list"},
		{"POST", "/v2/org-a/app/blobs/uploads/"},
		{"POST", "/v2/org-b/app/blobs/uploads/?mount=" + ld.String() + "&from=org-a/app"},
		{"DELETE", "/v2/org-a/app/manifests/" + d.String()},
	} {
		resp := do(t, f, c.method, c.path, "Bearer "+adminB)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s as org B: %d, want 404", c.method, c.path, resp.StatusCode)
		}
	}
	if resp := do(t, f, "GET", "/v2/_catalog", "Bearer "+adminA); resp.StatusCode == http.StatusOK {
		t.Errorf("catalog served (it would list other organizations' repositories)")
	}
}

// do sends a bodiless request and returns the response with its body closed.
func do(t *testing.T, f *fixture, method, path, authz string) reply {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}
}

type reply struct {
	StatusCode int
	Header     http.Header
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t, Config{})
	push(t, f, "org-a/app:v1", basic(adminA))
	resp := do(t, f, "GET", "/v2/", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic realm=") {
		t.Fatalf("no credentials: %d %q, want 401 with a Basic challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if resp := do(t, f, "GET", "/v2/", "Bearer "+adminA); resp.StatusCode != http.StatusOK {
		t.Fatalf("/v2/ with a key: %d", resp.StatusCode)
	}
	if resp := do(t, f, "GET", "/v2/org-a/app/tags/list", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tags without credentials: %d", resp.StatusCode)
	}
	good, _ := f.reg.MintPullToken("org-a", time.Minute)
	forged := good[:len(good)-2] + "AA"
	other, _ := (tokens{key: []byte(strings.Repeat("z", 32)), now: time.Now}).mint("org-a", ScopePull, time.Minute)
	for name, secret := range map[string]string{
		"wrong key": "sbx_a1_nope", "forged token": forged, "token of another key": other,
		"garbage token": tokenPrefix + "x.y", "huge": strings.Repeat("a", 10000),
	} {
		_, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(secret))
		if status(err) != http.StatusUnauthorized {
			t.Errorf("%s: %v, want 401", name, err)
		}
	}
	// Expiry.
	f.now = f.now.Add(2 * time.Minute)
	if _, err := remote.Image(f.ref(t, "org-a/app:v1"), basic(good)); status(err) != http.StatusUnauthorized {
		t.Errorf("expired pull token: %v, want 401", err)
	}
}

func TestPullOnlyCredentialsCannotPush(t *testing.T) {
	f := newFixture(t, Config{})
	tok, _ := f.reg.MintPullToken("org-a", time.Minute)
	for name, opt := range map[string]remote.Option{"pull token": basic(tok), "user key": basic(userA)} {
		img, _ := random.Image(512, 1)
		err := remote.Write(f.ref(t, "org-a/app:v1"), img, opt)
		if status(err) != http.StatusForbidden {
			t.Errorf("%s pushing: %v, want 403", name, err)
		}
	}
}

func TestUploadSizeLimit(t *testing.T) {
	f := newFixture(t, Config{MaxUploadBytes: 4096})
	img, _ := random.Image(64<<10, 1)
	if err := remote.Write(f.ref(t, "org-a/big:v1"), img, basic(adminA)); status(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "SIZE_INVALID") {
		t.Fatalf("a 64 KiB layer pushed with a 4 KiB limit: %v, want 400 SIZE_INVALID", err)
	}
	push(t, f, "org-a/small:v1", basic(adminA)) // 1 KiB layers
}

func TestBadNames(t *testing.T) {
	f := newFixture(t, Config{})
	for _, p := range []string{
		"/v2/org-a/../org-b/app/tags/list",
		"/v2/org-a/%2e%2e/org-b/app/tags/list",
		"/v2/org-a/UPPER/tags/list",
		"/v2/org-a/" + strings.Repeat("a", 300) + "/tags/list",
		"/v2/org-a/tags/list",
		"/v2/org-b/app/tags/list",
	} {
		resp := do(t, f, "GET", p, "Bearer "+adminA)
		if resp.StatusCode < 400 || resp.StatusCode == http.StatusUnauthorized {
			t.Errorf("GET %s: %d, want a refusal", p, resp.StatusCode)
		}
	}
	if _, err := RepositoryName("Org", "x"); err == nil {
		t.Error("an uppercase org accepted")
	}
	if _, err := RepositoryName("org-a", "../x"); err == nil {
		t.Error("a traversal accepted")
	}
}

func blobOnDisk(t *testing.T, f *fixture, d string) bool {
	hex := strings.TrimPrefix(d, "sha256:")
	_, err := os.Stat(filepath.Join(f.reg.cfg.Dir, "docker/registry/v2/blobs/sha256", hex[:2], hex, "data"))
	return err == nil
}

func TestPullCredentials(t *testing.T) {
	f := newFixture(t, Config{})
	u, p, ok := f.reg.PullCredentials("org-a", f.host+"/org-a/app:v1")
	if !ok || u == "" {
		t.Fatal("no credentials for an image of this registry")
	}
	if c, err := f.reg.tokens.check(p); err != nil || c.org != "org-a" || c.scope != ScopePull {
		t.Fatalf("credentials %v %v", c, err)
	}
	if _, _, ok := f.reg.PullCredentials("org-a", "docker.io/library/alpine:3"); ok {
		t.Fatal("credentials for another registry")
	}
	if _, _, ok := f.reg.PullCredentials("org-a", fmt.Sprintf("%s.evil.example/org-a/app", f.host)); ok {
		t.Fatal("credentials for a look-alike host")
	}
	// The same host on another port, or named otherwise, is another registry.
	h, port, _ := strings.Cut(f.host, ":")
	n, _ := strconv.Atoi(port)
	for _, other := range []string{h + ":" + strconv.Itoa(n%65535+1) + "/org-a/app", "localhost:" + port + "/org-a/app", h + "/org-a/app", "evil.example/" + f.host + "/org-a/app"} {
		if _, _, ok := f.reg.PullCredentials("org-a", other); ok {
			t.Errorf("credentials for %s (the registry is %s)", other, f.host)
		}
	}
}

func FuzzTokenCheck(f *testing.F) {
	tk := tokens{key: []byte(strings.Repeat("k", 32)), now: time.Now}
	good, _ := tk.mint("org-a", ScopePull, time.Minute)
	f.Add(good)
	f.Add(tokenPrefix + "a.b")
	f.Add("sbx_x_y")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := tk.check(s)
		if err == nil && s != good {
			t.Fatalf("accepted %q as %+v", s, c)
		}
	})
}

// TestChunkedUploadLimit: a blob sent in chunks, each under the limit, is bounded as a
// whole.
func TestChunkedUploadLimit(t *testing.T) {
	f := newFixture(t, Config{MaxUploadBytes: 4096})
	send := func(method, loc string, body []byte) reply {
		t.Helper()
		u := loc
		if strings.HasPrefix(loc, "/") {
			u = f.srv.URL + loc
		}
		req, _ := http.NewRequest(method, u, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminA)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return reply{StatusCode: resp.StatusCode, Header: resp.Header}
	}
	resp := send("POST", "/v2/org-a/chunks/blobs/uploads/", nil)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("start upload: %d", resp.StatusCode)
	}
	chunk := bytes.Repeat([]byte("x"), 3000)
	resp = send("PATCH", resp.Header.Get("Location"), chunk)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("first chunk: %d", resp.StatusCode)
	}
	loc := resp.Header.Get("Location")
	if resp := send("PATCH", loc, chunk); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("second chunk over the blob limit: %d, want 400 SIZE_INVALID", resp.StatusCode)
	}
	if resp := send("PATCH", loc, chunk[:1000]); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a chunk within the limit: %d", resp.StatusCode)
	}
}

// FuzzUploadOffset: the upload state of a request is trusted only when signed with the
// registry's secret for that repository.
func FuzzUploadOffset(f *testing.F) {
	r := &Registry{uploadSecret: "s3cret"}
	sign := func(secret, payload string) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(payload))
		return base64.URLEncoding.EncodeToString(append(m.Sum(nil), payload...))
	}
	good := sign("s3cret", `{"Name":"org-a/x","UUID":"u","Offset":42}`)
	if off, ok := r.uploadOffset(good, "org-a/x"); !ok || off != 42 {
		f.Fatalf("a signed state: %d %v", off, ok)
	}
	if _, ok := r.uploadOffset(good, "org-b/x"); ok {
		f.Fatal("a state of another repository accepted")
	}
	if _, ok := r.uploadOffset(sign("other", `{"Name":"org-a/x","Offset":0}`), "org-a/x"); ok {
		f.Fatal("a state signed with another secret accepted")
	}
	f.Add(good)
	f.Add("")
	f.Add("AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		if off, ok := r.uploadOffset(s, "org-a/x"); ok && (s != good || off != 42) {
			t.Fatalf("accepted %q at %d", s, off)
		}
	})
}
