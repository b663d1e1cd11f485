package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
)

// readLog is a blob store that records the keys read (Stat and Get).
type readLog struct {
	blob.Store
	mu   sync.Mutex
	keys []string
}

func (r *readLog) Stat(ctx context.Context, key string) (blob.Info, error) {
	r.mu.Lock()
	r.keys = append(r.keys, key)
	r.mu.Unlock()
	return r.Store.Stat(ctx, key)
}

func (r *readLog) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r.mu.Lock()
	r.keys = append(r.keys, key)
	r.mu.Unlock()
	return r.Store.Get(ctx, key)
}

func (r *readLog) read() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.keys
	r.keys = nil
	return out
}

// ctxObjEnv is a build gateway with a directory blob store (bucket "local").
func ctxObjEnv(t *testing.T, maxContext int, r *buildingRunner) (*buildEnv, *readLog) {
	t.Helper()
	d, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobs := &readLog{Store: d}
	e := newBuildEnvConfig(t, t.TempDir(), func(c *Config) {
		c.Blobs, c.SnapshotBucket = blobs, "local"
		c.Builds.MaxContextBytes = maxContext
	}, r)
	return e, blobs
}

// putContext PUTs body as build context name with key (chunked when chunked).
func putContext(t *testing.T, e *buildEnv, key, name, query string, body []byte, chunked bool) (int, map[string]any) {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // no length known
	}
	url := e.url + BuildContextsPath + name
	if query != "" {
		url += "?" + query
	}
	req, err := http.NewRequest("PUT", url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if chunked {
		req.ContentLength = -1
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(res.Body).Decode(&out)
	return res.StatusCode, out
}

func objOf(m map[string]any) *sandboxv1.BuildContextObject {
	s := func(k string) string { v, _ := m[k].(string); return v }
	return &sandboxv1.BuildContextObject{Location: s("location"), Bucket: s("bucket"), Key: s("key"), VersionId: s("versionId")}
}

// TestBuildContextObjects: a context PUT to /v1/buildContexts/{name} (any key of the
// organization) and named in build_context_objects is built exactly like build_contexts
// (its tree is the build's context; the same context builds nothing new); an object of
// another organization, another bucket, a key outside the organization's prefix or an
// old version is CWSANDBOX_BUILD_CONTEXT_NOT_FOUND and never read.
func TestBuildContextObjects(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e, blobs := ctxObjEnv(t, 0, r)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	const file = "services: {app: {build: {context: ., dockerfile: Dockerfile}, command: [sleep, inf]}}"
	v1 := contextTarOf(t, true, ctxFile{name: "Dockerfile", data: "FROM busybox\nCOPY hello.txt /hello.txt\n"}, ctxFile{name: "hello.txt", data: "v1"})

	// Authentication comes before the body, which is never read without a key.
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("PUT", e.url+BuildContextsPath+"app", pr)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %v %v", res, err)
	}
	res.Body.Close()

	code, out := putContext(t, e, e.user, "app-ctx", "", v1, false)
	if code != http.StatusOK || out["location"] != "platform" || out["bucket"] != "local" || out["key"] != "build-contexts/"+testOrg+"/app-ctx" ||
		!strings.HasPrefix(out["versionId"].(string), "sha256:") {
		t.Fatalf("put: %d %v", code, out)
	}
	obj1 := objOf(out)
	withObj := func(o *sandboxv1.BuildContextObject) *sandboxv1.CreateSandboxFromFileRequest {
		m := fileReq(file)
		m.BuildContextObjects = map[string]*sandboxv1.BuildContextObject{"app": o}
		return m
	}
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withObj(obj1))); err != nil {
		t.Fatal(err)
	}
	reqs, contexts := r.requests()
	if len(reqs) != 1 || reqs[0].Options.Dockerfile != "Dockerfile" {
		t.Fatalf("builds %+v", reqs)
	}
	if b, err := os.ReadFile(filepath.Join(extractContext(t, contexts[0]), "hello.txt")); err != nil || string(b) != "v1" {
		t.Fatalf("hello.txt in the build's context: %q %v", b, err)
	}
	// The same context inline builds nothing new: the two ways are one build.
	inline := fileReq(file)
	inline.BuildContexts = map[string][]byte{"app": v1}
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, inline)); err != nil {
		t.Fatal(err)
	}
	if reqs, _ := r.requests(); len(reqs) != 1 {
		t.Fatalf("the same context inline built again: %d builds", len(reqs))
	}
	blobs.read()

	// Refused without a read: another organization, another bucket, outside the prefix.
	for _, tc := range []struct {
		name, key string
		o         *sandboxv1.BuildContextObject
	}{
		{"another organization", e.otherAdmin, obj1},
		{"another bucket", e.user, &sandboxv1.BuildContextObject{Bucket: "other", Key: obj1.Key}},
		{"traversal", e.user, &sandboxv1.BuildContextObject{Bucket: "local", Key: "build-contexts/" + testOrg + "/../org-b/x"}},
		{"outside the prefix", e.user, &sandboxv1.BuildContextObject{Bucket: "local", Key: "fss/" + testOrg + "/x.tar.zst"}},
		{"nested", e.user, &sandboxv1.BuildContextObject{Bucket: "local", Key: "build-contexts/" + testOrg + "/a/b"}},
	} {
		_, err := sc.CreateSandboxFromFile(ctx, as(tc.key, withObj(tc.o)))
		wantTmplErr(t, err, connect.CodeNotFound, apierr.BuildContextNotFound, "")
		if got := blobs.read(); len(got) != 0 {
			t.Fatalf("%s: read %v", tc.name, got)
		}
	}
	// A name of the organization that does not exist, and a replaced version.
	_, err = sc.CreateSandboxFromFile(ctx, as(e.user, withObj(&sandboxv1.BuildContextObject{Bucket: "local", Key: "build-contexts/" + testOrg + "/nope"})))
	wantTmplErr(t, err, connect.CodeNotFound, apierr.BuildContextNotFound, "")
	v2 := contextTarOf(t, false, ctxFile{name: "Dockerfile", data: "FROM busybox\nCOPY hello.txt /hello.txt\n"}, ctxFile{name: "hello.txt", data: "v2"})
	code, out = putContext(t, e, e.admin, "app-ctx", "", v2, true)
	if code != http.StatusOK || out["versionId"] == obj1.VersionId {
		t.Fatalf("replace: %d %v", code, out)
	}
	_, err = sc.CreateSandboxFromFile(ctx, as(e.user, withObj(obj1)))
	wantTmplErr(t, err, connect.CodeNotFound, apierr.BuildContextNotFound, "")
	// Without version_id and location: the current object.
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, withObj(&sandboxv1.BuildContextObject{Bucket: "local", Key: obj1.Key}))); err != nil {
		t.Fatal(err)
	}
	reqs, contexts = r.requests()
	if b, _ := os.ReadFile(filepath.Join(extractContext(t, contexts[len(contexts)-1]), "hello.txt")); len(reqs) != 2 || string(b) != "v2" {
		t.Fatalf("the replaced context: %d builds, hello.txt %q", len(reqs), b)
	}

	// Malformed entries: INVALID_ARGUMENT naming the field.
	for _, tc := range []struct {
		m     func() *sandboxv1.CreateSandboxFromFileRequest
		field string
	}{
		{func() *sandboxv1.CreateSandboxFromFileRequest {
			return withObj(&sandboxv1.BuildContextObject{Bucket: "local"})
		}, "build_context_objects[app].key"},
		{func() *sandboxv1.CreateSandboxFromFileRequest {
			return withObj(&sandboxv1.BuildContextObject{Key: obj1.Key})
		}, "build_context_objects[app].bucket"},
		{func() *sandboxv1.CreateSandboxFromFileRequest {
			return withObj(&sandboxv1.BuildContextObject{Bucket: "local", Key: obj1.Key, VersionId: "3"})
		}, "build_context_objects[app].version_id"},
		{func() *sandboxv1.CreateSandboxFromFileRequest {
			return withObj(&sandboxv1.BuildContextObject{Bucket: "local", Key: obj1.Key, Location: "us-east-1"})
		}, "build_context_objects[app].location"},
		{func() *sandboxv1.CreateSandboxFromFileRequest {
			m := withObj(obj1)
			m.BuildContexts = map[string][]byte{"app": v1}
			return m
		}, "build_context_objects[app]"},
	} {
		_, err := sc.CreateSandboxFromFile(ctx, as(e.user, tc.m()))
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, tc.field)
	}

	// Uploads: a bad name, a query parameter, an empty body.
	for _, tc := range []struct{ name, query, field string }{{"_x", "", "name"}, {"app", "overwrite=true", "overwrite"}, {"empty", "", "body"}} {
		body := v1
		if tc.name == "empty" {
			body = nil
		}
		if code, out := putContext(t, e, e.user, tc.name, tc.query, body, false); code != http.StatusBadRequest || !strings.Contains(strings.ToLower(out["message"].(string)), tc.field) {
			t.Errorf("upload %s?%s: %d %v", tc.name, tc.query, code, out)
		}
	}

	// An organization whose builds are disabled can neither upload nor build from one.
	blobs.read()
	settings := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, e.url)
	if _, err := settings.UpdateBuildStorageConfig(ctx, as(e.admin, &sandboxv1.UpdateBuildStorageConfigRequest{
		BuildStorageConfig: &sandboxv1.BuildStorageConfig{}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"enabled"}}})); err != nil {
		t.Fatal(err)
	}
	if code, out := putContext(t, e, e.user, "app-ctx", "", v1, false); code != http.StatusBadRequest || out["code"] != float64(connect.CodeFailedPrecondition) || !strings.Contains(out["message"].(string), "enabled: false") {
		t.Errorf("upload while disabled: %d %v", code, out)
	}
	_, err = sc.CreateSandboxFromFile(ctx, as(e.user, withObj(obj1)))
	wantTmplErr(t, err, connect.CodeFailedPrecondition, apierr.BuildNotSupported, "")
	if got := blobs.read(); len(got) != 0 {
		t.Fatalf("a disabled organization's object was read: %v", got)
	}
}

// TestBuildContextObjectBounds: an upload over the context bound is refused (known length
// before it is read, unknown when it passes the bound) and nothing is stored; an object
// over the bound already in the store is refused before it is read whole.
func TestBuildContextObjectBounds(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e, blobs := ctxObjEnv(t, 4096, r)
	big := bytes.Repeat([]byte("x"), 5000)
	for _, chunked := range []bool{false, true} {
		if code, out := putContext(t, e, e.user, "big", "", big, chunked); code != http.StatusBadRequest || !strings.Contains(out["message"].(string), "4096") {
			t.Fatalf("chunked %v: %d %v", chunked, code, out)
		}
	}
	for info, err := range blobs.List(ctx, "") {
		t.Fatalf("stored after refused uploads: %v %v", info, err)
	}
	// Exactly the bound is taken.
	if code, out := putContext(t, e, e.user, "ok", "", big[:4096], true); code != http.StatusOK {
		t.Fatalf("at the bound: %d %v", code, out)
	}
	key := buildContextKey(testOrg, "big")
	if _, err := blobs.Store.Put(ctx, key, bytes.NewReader(big), int64(len(big))); err != nil {
		t.Fatal(err)
	}
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	m := fileReq("services: {app: {build: ., command: [sleep, inf]}}")
	m.BuildContextObjects = map[string]*sandboxv1.BuildContextObject{"app": {Bucket: "local", Key: key}}
	_, err := sc.CreateSandboxFromFile(ctx, as(e.user, m))
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, "build_context_objects[app]")
	if got := blobs.read(); len(got) != 1 {
		t.Fatalf("reads of an object over the bound: %v (want its Stat only)", got)
	}
	if reqs, _ := r.requests(); len(reqs) != 0 {
		t.Fatalf("built: %v", reqs)
	}
}

// TestBuildContextObjectsWithoutBlobStore: no blob store, no uploads and no objects, said so.
func TestBuildContextObjectsWithoutBlobStore(t *testing.T) {
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e := newBuildEnv(t, t.TempDir(), nil, r)
	if code, out := putContext(t, e, e.user, "app", "", []byte("x"), false); code != http.StatusBadRequest || out["code"] != float64(connect.CodeFailedPrecondition) || !strings.Contains(out["message"].(string), "blob store") {
		t.Fatalf("upload: %d %v", code, out)
	}
	m := fileReq("services: {app: {build: ., command: [sleep, inf]}}")
	m.BuildContextObjects = map[string]*sandboxv1.BuildContextObject{"app": {Bucket: "local", Key: "build-contexts/" + testOrg + "/app"}}
	_, err := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url).CreateSandboxFromFile(t.Context(), as(e.user, m))
	wantTmplErr(t, err, connect.CodeFailedPrecondition, apierr.BuildNotSupported, "")
}

// TestBuildContextRetention: the sweep deletes uploaded contexts older than the retention
// (a fake clock), and none without one.
func TestBuildContextRetention(t *testing.T) {
	ctx := t.Context()
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	clock := &fakeClock{t: time.Now()}
	d, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := newBuildEnvConfig(t, t.TempDir(), func(c *Config) {
		c.Blobs, c.SnapshotBucket = d, "local"
		c.Builds.Retention, c.Builds.SweepInterval, c.Builds.Now = 30*24*time.Hour, -1, clock.now
	}, r)
	if code, out := putContext(t, e, e.user, "a", "", []byte("tar"), false); code != http.StatusOK {
		t.Fatalf("put: %d %v", code, out)
	}
	if _, err := d.Put(ctx, "fss/other/x.tar.zst", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.builds.sweepContexts(ctx); err != nil || n != 0 {
		t.Fatalf("within the retention: %d, %v", n, err)
	}
	clock.set(time.Now().Add(31 * 24 * time.Hour))
	if n, err := e.s.builds.sweepContexts(ctx); err != nil || n != 1 {
		t.Fatalf("past the retention: %d, %v", n, err)
	}
	if _, err := d.Stat(ctx, buildContextKey(testOrg, "a")); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the old context: %v", err)
	}
	if _, err := d.Stat(ctx, "fss/other/x.tar.zst"); err != nil {
		t.Fatalf("an object outside build-contexts/: %v", err)
	}
}

// FuzzOwnBuildContextKey: a key accepted as org's is exactly buildContextKey(org, name) of
// a name PUT accepts: never another organization's, never with a ".." or a nested path.
func FuzzOwnBuildContextKey(f *testing.F) {
	for _, seed := range [][2]string{{"org-a", "build-contexts/org-a/app"}, {"org-a", "build-contexts/org-b/app"}, {"org-a", "build-contexts/org-a/../org-b/x"},
		{"org-a", "build-contexts/org-a/a/b"}, {"a/b", "build-contexts/a/b/c"}, {"org-a", "build-contexts/org-a/.x"}, {"org-a", "build-contexts/org-a/a..b"}, {"", "build-contexts//x"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, org, key string) {
		if !ownBuildContextKey(org, key) {
			return
		}
		name := key[strings.LastIndexByte(key, '/')+1:]
		if key != buildContextKey(org, name) || !buildContextNameRE.MatchString(name) || slices.Contains(strings.Split(key, "/"), "..") || blob.ValidateKey(key) != nil {
			t.Fatalf("accepted %q for %q", key, org)
		}
		for _, other := range []string{org + "x", "x" + org} {
			if orgKeyComponent(other) != orgKeyComponent(org) && ownBuildContextKey(other, key) {
				t.Fatalf("%q is both %q's and %q's", key, org, other)
			}
		}
	})
}

// TestBuildContextObjectsS3: the same through an S3 blob store (SeaweedFS): the upload is
// streamed there, its bucket is effective_bucket_name, and a create builds from it;
// another organization's key is not found.
func TestBuildContextObjectsS3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts SeaweedFS")
	}
	ctx := t.Context()
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	st, err := s3.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e := newBuildEnvConfig(t, t.TempDir(), func(c *Config) { c.Blobs, c.SnapshotBucket = st, cfg.Bucket }, r)
	tarBytes := contextTarOf(t, true, ctxFile{name: "Dockerfile", data: "FROM busybox\nCOPY f /f\n"}, ctxFile{name: "f", data: "s3"})
	code, out := putContext(t, e, e.user, "ctx", "", tarBytes, true)
	if code != http.StatusOK || out["bucket"] != cfg.Bucket {
		t.Fatalf("put: %d %v", code, out)
	}
	settings := sandboxv1connect.NewSettingsServiceClient(http.DefaultClient, e.url)
	if bsc, err := settings.GetBuildStorageConfig(ctx, as(e.user, &sandboxv1.GetBuildStorageConfigRequest{})); err != nil || bsc.Msg.GetEffectiveBucketName() != cfg.Bucket {
		t.Fatalf("effective bucket: %v, %v", bsc, err)
	}
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, e.url)
	m := fileReq("services: {app: {build: ., command: [sleep, inf]}}")
	m.BuildContextObjects = map[string]*sandboxv1.BuildContextObject{"app": objOf(out)}
	if _, err := sc.CreateSandboxFromFile(ctx, as(e.user, m)); err != nil {
		t.Fatal(err)
	}
	_, contexts := r.requests()
	if len(contexts) != 1 {
		t.Fatalf("%d builds", len(contexts))
	}
	if b, _ := os.ReadFile(filepath.Join(extractContext(t, contexts[0]), "f")); string(b) != "s3" {
		t.Fatalf("f in the build's context: %q", b)
	}
	_, err = sc.CreateSandboxFromFile(ctx, as(e.otherAdmin, m))
	wantTmplErr(t, err, connect.CodeNotFound, apierr.BuildContextNotFound, "")
}

// TestBuildContextUploadLimits: an organization keeps at most maxBuildContextsPerOrg
// uploaded contexts and maxBuildContextBytesPerOrg bytes of them; replacing a name counts
// only its new bytes; a refused upload stores nothing.
func TestBuildContextUploadLimits(t *testing.T) {
	oldN, oldB := maxBuildContextsPerOrg, maxBuildContextBytesPerOrg
	maxBuildContextsPerOrg, maxBuildContextBytesPerOrg = 3, 100
	t.Cleanup(func() { maxBuildContextsPerOrg, maxBuildContextBytesPerOrg = oldN, oldB })
	r := &buildingRunner{acceptingRunner: acceptingRunner{id: "r1"}, builderImage: "localhost/builder:1", build: okBuild(testDigest)}
	e, blobs := ctxObjEnv(t, 4096, r)
	ten := bytes.Repeat([]byte("x"), 10)
	for _, n := range []string{"a", "b", "c"} {
		if code, out := putContext(t, e, e.user, n, "", ten, false); code != http.StatusOK {
			t.Fatalf("%s: %d %v", n, code, out)
		}
	}
	code, out := putContext(t, e, e.user, "d", "", ten, false)
	if code != http.StatusTooManyRequests || out["code"] != float64(connect.CodeResourceExhausted) || !strings.Contains(out["message"].(string), "at most 3") {
		t.Fatalf("a fourth context: %d %v", code, out)
	}
	if _, err := blobs.Stat(t.Context(), buildContextKey(testOrg, "d")); err == nil {
		t.Fatal("the refused context was stored")
	}
	if code, out := putContext(t, e, e.user, "a", "", bytes.Repeat([]byte("y"), 20), false); code != http.StatusOK {
		t.Fatalf("replacing a: %d %v", code, out)
	}
	maxBuildContextsPerOrg = 10
	// b and c take 20 bytes, a 20: 60 more would make 100, 61 more 101.
	if code, out := putContext(t, e, e.user, "d", "", bytes.Repeat([]byte("z"), 61), false); code != http.StatusTooManyRequests || !strings.Contains(out["message"].(string), "more than 100") {
		t.Fatalf("over the bytes: %d %v", code, out)
	}
	if code, out := putContext(t, e, e.user, "d", "", bytes.Repeat([]byte("z"), 60), false); code != http.StatusOK {
		t.Fatalf("at the bytes bound: %d %v", code, out)
	}
}
