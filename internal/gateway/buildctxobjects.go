package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Build contexts in object storage (CreateSandboxFromFile.build_context_objects; docs/builds.md,
// "Build context objects"). A context is put with PUT /v1/buildContexts/{name} (a tar,
// plain or gzip, streamed to the gateway's blob store under build-contexts/<org>/<name>)
// and named in build_context_objects[service] by the BuildContextObject the PUT answers.
// The gateway reads an object only when its bucket is the organization's
// effective_bucket_name (the blob store's) and its key is under the organization's own
// prefix: any other key is CWSANDBOX_BUILD_CONTEXT_NOT_FOUND without a read. What it
// reads becomes build_contexts[service] (the same bound per context) and is built exactly
// like a context sent inline.

const (
	// BuildContextsPath is the REST path of build context uploads (PUT BuildContextsPath+NAME).
	BuildContextsPath = "/v1/buildContexts/"
	// buildContextPrefix is where the contexts live in the blob store.
	buildContextPrefix = "build-contexts/"
	// buildContextLocation is BuildContextObject.location of every context: the
	// gateway's blob store is the one place.
	buildContextLocation = "platform"
	// maxBuildContextObjects bounds build_context_objects' entries.
	maxBuildContextObjects = 32
	// maxBuildContextsPerOrg and maxBuildContextBytesPerOrg bound what one organization
	// keeps uploaded (until --build-retention sweeps it): a PUT of a new name beyond the
	// count, or one that would take the organization's total beyond the bytes, is
	// RESOURCE_EXHAUSTED CWSANDBOX_BUILD_CONTEXT_LIMIT_EXCEEDED. Replacing a name counts
	// only the difference. Concurrent uploads are checked one by one, not together, so
	// a burst may pass the bounds by what is in flight at once.
)

var (
	maxBuildContextsPerOrg           = 256
	maxBuildContextBytesPerOrg int64 = 2 << 30 // tests lower both
)

var (
	buildContextNameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	buildContextVersionRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ExtraRoutes are the REST routes the gateway serves beside its services' annotations
// (for apifront.Config.Routes).
func ExtraRoutes() []apifront.Route {
	return []apifront.Route{apifront.RawRoute(http.MethodPut, BuildContextsPath+"{name}")}
}

// buildContextKey is the blob key of org's context name.
func buildContextKey(org, name string) string {
	return buildContextPrefix + orgKeyComponent(org) + "/" + name
}

func (s *Server) maxBuildContextBytes() int64 {
	if s.builds == nil {
		return DefaultMaxBuildContextBytes
	}
	return int64(s.builds.cfg.MaxContextBytes)
}

// putBuildContext serves PUT /v1/buildContexts/{name}: authenticated from the headers
// before the body is read, the body bounded and streamed to the blob store; the answer is
// the BuildContextObject (JSON) to name in build_context_objects.
func (s *Server) putBuildContext(w http.ResponseWriter, r *http.Request) {
	refuse := func(err error) {
		// The body may be unread: an HTTP/1 client still sending it gets the answer and
		// its connection closed (the server would otherwise wait to drain it).
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		apifront.WriteRESTError(w, err)
	}
	ctx, err := auth.Interceptor{Auth: s.auth}.Authorize(r.Context(), r.Header)
	if err != nil {
		refuse(err)
		return
	}
	obj, err := s.storeBuildContext(ctx, r.PathValue("name"), r.URL.Query(), r.Body, r.ContentLength)
	if err != nil {
		refuse(err)
		return
	}
	b, err := protojson.Marshal(obj)
	if err != nil {
		refuse(err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// storeBuildContext checks an upload and streams body (length n, -1 unknown) to the
// caller's organization's context name.
func (s *Server) storeBuildContext(ctx context.Context, name string, q url.Values, body io.Reader, n int64) (*sandboxv1.BuildContextObject, error) {
	org := principal(ctx).Org
	var vs []apierr.Violation
	for k := range q {
		vs = append(vs, apierr.Violation{Field: textclip.Clip(k, 64), Description: "is not a query parameter of PUT " + BuildContextsPath + "{name} (it takes none)"})
	}
	if !buildContextNameRE.MatchString(name) {
		vs = append(vs, apierr.Violation{Field: "name", Description: fmt.Sprintf("%q: 1 to 128 of [A-Za-z0-9._-], starting with a letter or digit", textclip.Clip(name, 64))})
	}
	max := s.maxBuildContextBytes()
	switch {
	case n == 0:
		vs = append(vs, apierr.Violation{Field: "body", Description: "is empty: send the context directory as a tar (plain or gzip)"})
	case n > max:
		vs = append(vs, apierr.Violation{Field: "body", Description: fmt.Sprintf("is %d bytes; at most %d", n, max)})
	}
	if len(vs) > 0 {
		slices.SortFunc(vs, func(a, b apierr.Violation) int { return strings.Compare(a.Field, b.Field) })
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build context upload: "+apierr.Describe(vs), vs)
	}
	if err := s.buildsEnabled(ctx, org); err != nil {
		return nil, err
	}
	st, bucket, location, err := s.buildContextStore(ctx, org)
	if err != nil {
		return nil, err
	}
	key := buildContextKey(org, name)
	if err := s.buildContextRoom(ctx, st, org, key, n, max); err != nil {
		return nil, err
	}
	lr := &maxReader{r: body, left: max}
	info, err := st.Put(ctx, key, lr, n)
	switch {
	case lr.over:
		vs := []apierr.Violation{{Field: "body", Description: fmt.Sprintf("is more than %d bytes", max)}}
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build context upload: "+apierr.Describe(vs), vs)
	case errors.Is(err, blob.ErrSizeMismatch):
		vs := []apierr.Violation{{Field: "body", Description: "is not Content-Length bytes long"}}
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build context upload: "+apierr.Describe(vs), vs)
	case err != nil && ctx.Err() != nil:
		return nil, apierr.Newf(apierr.InvalidRequest, "the upload ended before its body did: %v", ctx.Err())
	case err != nil:
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "the build context cannot be stored now: %s", textclip.Clip(err.Error(), 300)), 5*time.Second)
	}
	if info.Size == 0 {
		_ = st.Delete(ctx, key)
		vs := []apierr.Violation{{Field: "body", Description: "is empty: send the context directory as a tar (plain or gzip)"}}
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid build context upload: "+apierr.Describe(vs), vs)
	}
	s.log.Info("build context stored", "org", org, "bucket", bucket, "key", key, "bytes", info.Size)
	return &sandboxv1.BuildContextObject{Location: location, Bucket: bucket, Key: key, VersionId: "sha256:" + info.SHA256}, nil
}

// buildContextStore is where org's build contexts live: its own bucket when its build
// storage is CUSTOMER_OWNED (BuildContextObject.location: the endpoint), else the
// gateway's blob store (location "platform").
func (s *Server) buildContextStore(ctx context.Context, org string) (blob.Store, string, string, error) {
	c, err := s.OrgBuildStorage(ctx, org)
	if err != nil {
		if connect.CodeOf(err) != connect.CodeUnknown {
			return nil, "", "", err
		}
		return nil, "", "", apierr.WithRetry(apierr.New(apierr.BuildStorageUnavailable, "the organization's build storage cannot be used now: "+textclip.Clip(err.Error(), 300), nil), 5*time.Second)
	}
	if c == nil {
		if s.blobs == nil {
			return nil, "", "", apierr.New(apierr.BuildNotSupported, "this gateway has no blob store for build contexts (sandboxd --blob-dir or --blob-s3-*): send the contexts in build_contexts", nil)
		}
		return s.blobs, s.buildBucket(), buildContextLocation, nil
	}
	st, err := s3.New(ctx, *c)
	if err != nil {
		// Not the error's text: the bucket and endpoint are enough.
		return nil, "", "", apierr.WithRetry(apierr.New(apierr.BuildStorageUnavailable, fmt.Sprintf("the organization's build storage (bucket %q at %s) cannot be used now", c.Bucket, c.Endpoint), nil), 5*time.Second)
	}
	return st, c.Bucket, c.Endpoint, nil
}

// buildContextRoom is nil when org may store one more context at key (n bytes, -1
// unknown: counted as max), else why not.
func (s *Server) buildContextRoom(ctx context.Context, st blob.Store, org, key string, n, max int64) error {
	if n < 0 {
		n = max
	}
	count, total := 0, int64(0)
	for info, err := range st.List(ctx, buildContextPrefix+orgKeyComponent(org)+"/") {
		if err != nil {
			return apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "the organization's build contexts cannot be counted now: %s", textclip.Clip(err.Error(), 300)), 5*time.Second)
		}
		if info.Key == key {
			continue // replaced: only the new bytes count
		}
		count++
		total += info.Size
	}
	switch {
	case count >= maxBuildContextsPerOrg:
		return apierr.New(apierr.BuildContextLimitExceeded, fmt.Sprintf("the organization holds %d build contexts; at most %d (replace one by its name, or wait for the build retention to remove old ones)", count, maxBuildContextsPerOrg),
			map[string]string{"limit": strconv.Itoa(maxBuildContextsPerOrg), "current": strconv.Itoa(count)})
	case total+n > maxBuildContextBytesPerOrg:
		return apierr.New(apierr.BuildContextLimitExceeded, fmt.Sprintf("the organization's build contexts take %d bytes; with this one (%d) more than %d", total, n, maxBuildContextBytesPerOrg),
			map[string]string{"limit": strconv.FormatInt(maxBuildContextBytesPerOrg, 10), "current": strconv.FormatInt(total, 10)})
	}
	return nil
}

// maxReader reads at most left bytes of r; one more is an error (over).
type maxReader struct {
	r    io.Reader
	left int64
	over bool
}

var errBuildContextTooLarge = errors.New("build context too large")

func (m *maxReader) Read(p []byte) (int, error) {
	if m.left <= 0 {
		var one [1]byte
		if n, _ := io.ReadFull(m.r, one[:]); n > 0 {
			m.over = true
			return 0, errBuildContextTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > m.left {
		p = p[:m.left]
	}
	n, err := m.r.Read(p)
	m.left -= int64(n)
	return n, err
}

// resolveBuildContextObjects reads m's build_context_objects into its build_contexts (and
// clears them), so the build takes build_contexts' path. Each is checked before it is
// read: the organization's bucket and prefix only, its version when given, its size.
func (s *Server) resolveBuildContextObjects(ctx context.Context, m *sandboxv1.CreateSandboxFromFileRequest) error {
	objs := m.GetBuildContextObjects()
	if len(objs) == 0 {
		return nil
	}
	org := principal(ctx).Org
	services := make([]string, 0, len(objs))
	for svc := range objs {
		services = append(services, svc)
	}
	slices.Sort(services)
	var vs []apierr.Violation
	if len(services) > maxBuildContextObjects {
		vs = append(vs, apierr.Violation{Field: "build_context_objects", Description: fmt.Sprintf("has %d entries; at most %d", len(services), maxBuildContextObjects)})
		services = services[:maxBuildContextObjects]
	}
	for _, svc := range services {
		o := objs[svc]
		f := "build_context_objects[" + textclip.Clip(svc, 64) + "]"
		if _, dup := m.GetBuildContexts()[svc]; dup {
			vs = append(vs, apierr.Violation{Field: f, Description: "the service is also in build_contexts: send its context one way"})
		}
		if o.GetBucket() == "" {
			vs = append(vs, apierr.Violation{Field: f + ".bucket", Description: "is required (the bucket PUT " + BuildContextsPath + "{name} answered: GetBuildStorageConfig's effective_bucket_name)"})
		}
		if o.GetKey() == "" {
			vs = append(vs, apierr.Violation{Field: f + ".key", Description: "is required (the key PUT " + BuildContextsPath + "{name} answered)"})
		}
		if l := o.GetLocation(); l != "" && l != buildContextLocation {
			vs = append(vs, apierr.Violation{Field: f + ".location", Description: fmt.Sprintf("%q: build contexts are in the platform's object store only (%q, or leave it empty)", textclip.Clip(l, 64), buildContextLocation)})
		}
		if v := o.GetVersionId(); v != "" && !buildContextVersionRE.MatchString(v) {
			vs = append(vs, apierr.Violation{Field: f + ".version_id", Description: "is sha256:<64 lowercase hex> as PUT " + BuildContextsPath + "{name} answered, or empty for the current object"})
		}
	}
	if len(vs) > 0 {
		return apierr.Invalid(apierr.InvalidRequest, "invalid build_context_objects: "+apierr.Describe(vs), vs)
	}
	// Nothing is read for an organization that cannot build.
	if err := s.builds.canBuild(ctx, org); err != nil {
		return withService(err, "building from build_context_objects")
	}
	st, bucket, _, err := s.buildContextStore(ctx, org)
	if err != nil {
		return err
	}
	max := s.maxBuildContextBytes()
	var total int64
	for _, c := range m.GetBuildContexts() {
		total += int64(len(c))
	}
	read := map[string][]byte{}
	for _, svc := range services {
		data, err := s.readBuildContextObject(ctx, st, bucket, org, svc, objs[svc], max)
		if err != nil {
			return err
		}
		if total += int64(len(data)); total > relay.MaxMessageBytes {
			vs := []apierr.Violation{{Field: "build_context_objects", Description: fmt.Sprintf("the contexts of one request are more than %d bytes together", relay.MaxMessageBytes)}}
			return apierr.Invalid(apierr.InvalidRequest, "invalid build_context_objects: "+apierr.Describe(vs), vs)
		}
		read[svc] = data
	}
	if m.BuildContexts == nil {
		m.BuildContexts = map[string][]byte{}
	}
	for svc, data := range read {
		m.BuildContexts[svc] = data
	}
	m.BuildContextObjects = nil
	return nil
}

// readBuildContextObject reads service svc's object o of org, within max bytes.
func (s *Server) readBuildContextObject(ctx context.Context, st blob.Store, bucket, org, svc string, o *sandboxv1.BuildContextObject, max int64) ([]byte, error) {
	f := "build_context_objects[" + textclip.Clip(svc, 64) + "]"
	notFound := func(why string) error {
		return apierr.New(apierr.BuildContextNotFound,
			fmt.Sprintf("%s: no build context object %s in bucket %s%s", f, textclip.Clip(o.GetKey(), 200), textclip.Clip(o.GetBucket(), 64), why),
			map[string]string{"service": textclip.Clip(svc, 64), "bucket": textclip.Clip(o.GetBucket(), 64), "key": textclip.Clip(o.GetKey(), 200)})
	}
	key := o.GetKey()
	if o.GetBucket() != bucket || !ownBuildContextKey(org, key) {
		return nil, notFound("") // never read: not the organization's
	}
	unavailable := func(err error) error {
		return apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "%s: the build context cannot be read now: %s", f, textclip.Clip(err.Error(), 300)), 5*time.Second)
	}
	info, err := st.Stat(ctx, key)
	switch {
	case errors.Is(err, blob.ErrNotFound):
		return nil, notFound("")
	case err != nil:
		return nil, unavailable(err)
	}
	want := o.GetVersionId()
	if want != "" && want != "sha256:"+info.SHA256 {
		return nil, notFound(" at version_id " + want + " (it was replaced)")
	}
	tooLarge := func(size int64) error {
		vs := []apierr.Violation{{Field: f, Description: fmt.Sprintf("the object is %s bytes; a build context is at most %d", strconv.FormatInt(size, 10), max)}}
		return apierr.Invalid(apierr.InvalidRequest, "invalid build_context_objects: "+apierr.Describe(vs), vs)
	}
	if info.Size > max {
		return nil, tooLarge(info.Size)
	}
	rc, err := st.Get(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, notFound("")
	} else if err != nil {
		return nil, unavailable(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, unavailable(err)
	}
	if int64(len(data)) > max {
		return nil, tooLarge(int64(len(data)))
	}
	if want != "" {
		// Replaced between Stat and Get: not the version asked for.
		if sum := sha256.Sum256(data); want != "sha256:"+hex.EncodeToString(sum[:]) {
			return nil, notFound(" at version_id " + want + " (it was replaced)")
		}
	}
	return data, nil
}

// ownBuildContextKey: key is a build context of org (build-contexts/<org>/<name>, one
// valid name, a valid blob key).
func ownBuildContextKey(org, key string) bool {
	rest, under := strings.CutPrefix(key, buildContextPrefix+orgKeyComponent(org)+"/")
	return under && buildContextNameRE.MatchString(rest) && blob.ValidateKey(key) == nil
}
