// Package registry is the platform's OCI registry: CNCF Distribution's registry app
// (github.com/distribution/distribution/v3) behind our own authentication and
// organization scoping, on the filesystem (the embedded default) or an S3-compatible
// bucket (multi-host).
//
// Repositories are "<org>/<name>": a caller reaches only its own organization's, and
// another organization's answers NAME_UNKNOWN (404) whatever it holds, so existence is
// never revealed. Credentials are checked from the headers before any body is read:
//
//   - an API key (Basic auth with the key as password, as `docker login` sends it, or
//     "Authorization: Bearer <key>"): SANDBOX_ADMIN keys pull and push, SANDBOX_USER keys
//     pull;
//   - a platform token minted by MintToken (HMAC-SHA256 with a key of the data dir,
//     expiry checked, constant-time compare), for one organization: pull-only tokens for
//     runners (MintPullToken), push tokens for image builds (MintPushToken).
//
// Without valid credentials the answer is 401 with `WWW-Authenticate: Basic`. The catalog
// is not served (it would list every organization's repositories). Deletes go through GC
// only: the API's DELETE is UNSUPPORTED.
package registry

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	v2 "github.com/distribution/distribution/v3/registry/api/v2"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the default storage
	_ "github.com/distribution/distribution/v3/registry/storage/driver/s3-aws"     // multi-host storage
	"github.com/distribution/reference"
	"github.com/gorilla/mux"
	"github.com/sirupsen/logrus"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
)

// orgRE is the organizations that can own repositories: an org ID must be one path
// component of a repository name (Distribution's grammar, lowercase).
var orgRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)

// Defaults.
const (
	DefaultMaxUploadBytes = 4 << 30 // one blob
	DefaultPullTokenTTL   = 15 * time.Minute
	maxKeyBytes           = 256 // API keys are 85 bytes
	// S3Prefix is where the registry's objects live in an S3 bucket shared with other
	// blob store users.
	S3Prefix = "/registry"
)

// Config configures a Registry: storage is exactly one of Dir and S3.
type Config struct {
	// Dir is the filesystem root of the storage (absolute).
	Dir string
	// S3 stores in this bucket under S3Prefix.
	S3 *s3.Config
	// Auth checks API keys.
	Auth auth.Authenticator
	// TokenKey signs platform tokens and upload state (at least 32 bytes; replicas serving
	// one storage share it).
	TokenKey []byte
	// MaxUploadBytes bounds a blob (0: DefaultMaxUploadBytes), whether uploaded in one
	// request or in chunks.
	// Manifests are bounded by Distribution (4 MiB).
	MaxUploadBytes int64
	// Host is host[:port] image references name this registry by ("" : PullCredentials
	// matches nothing).
	Host string
	// OrgStorage, optional, says where an organization's repositories are stored: an S3
	// bucket of its own (a build storage config of mode CUSTOMER_OWNED), or nil for the
	// platform storage (Dir or S3). It is asked again after OrgStorageTTL (0:
	// DefaultOrgStorageTTL), and at once after ForgetOrgStorage. An error wrapping
	// ErrOrgStorageTransient (the store cannot be read now) keeps the last answer in use
	// for reads (image pulls), for at most MaxStaleOrgStorage, unless ForgetOrgStorage
	// dropped it; any other error, and every write, is answered 503: an organization's
	// images are never written to a storage that may no longer be its own. See
	// orgstorage.go.
	OrgStorage func(ctx context.Context, org string) (*s3.Config, error)
	// OrgStorageTTL is how long an OrgStorage answer is used.
	OrgStorageTTL time.Duration
	// MaxOrgStorages bounds the organizations' storages kept open (0:
	// DefaultMaxOrgStorages; the least recently used is closed beyond it).
	MaxOrgStorages int
	Logger         *slog.Logger
	// now, for tests.
	now func() time.Time
}

// Registry serves /v2/ (http.Handler).
type Registry struct {
	cfg    Config
	router *mux.Router
	tokens tokens
	// platform is the platform storage (Dir or S3) and its Distribution app.
	platform *backend
	// orgs are the organizations' own storages (OrgStorage), opened on first use.
	orgs orgStorages
	// uploadSecret signs Distribution's upload state (configuration http.secret).
	uploadSecret string
	// ctx is New's, uncanceled: the organizations' Distribution apps are opened with it.
	ctx context.Context
}

var quietLogrus sync.Once

// New opens the storage and builds the registry.
func New(ctx context.Context, cfg Config) (r *Registry, err error) {
	if cfg.Auth == nil {
		return nil, errors.New("registry: no authenticator")
	}
	if len(cfg.TokenKey) < minKeyBytes {
		return nil, fmt.Errorf("registry: token key of %d bytes, need %d", len(cfg.TokenKey), minKeyBytes)
	}
	if cfg.MaxUploadBytes < 0 {
		return nil, errors.New("registry: negative max upload size")
	}
	if cfg.MaxUploadBytes == 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	typ, params, err := storageParams(cfg)
	if err != nil {
		return nil, err
	}
	// Distribution logs through logrus: every request at info, every answered error (a
	// 404 on each HEAD of a push) at error. Its warnings and errors go to our log, the
	// answered errors at debug.
	quietLogrus.Do(func() {
		logrus.SetLevel(logrus.ErrorLevel)
		logrus.SetOutput(io.Discard)
		logrus.AddHook(slogHook{cfg.Logger})
	})

	uploadSecret := derive(cfg.TokenKey, "upload-state")
	b, err := openBackend(ctx, typ, params, uploadSecret)
	if err != nil {
		return nil, err
	}
	if cfg.OrgStorageTTL <= 0 {
		cfg.OrgStorageTTL = DefaultOrgStorageTTL
	}
	if cfg.MaxOrgStorages <= 0 {
		cfg.MaxOrgStorages = DefaultMaxOrgStorages
	}
	return &Registry{cfg: cfg, router: v2.Router(), tokens: tokens{key: cfg.TokenKey, now: cfg.now}, platform: b,
		orgs: orgStorages{m: map[string]*orgStorage{}, gen: map[string]uint64{}}, uploadSecret: uploadSecret,
		ctx: context.WithoutCancel(ctx)}, nil
}

// backend is one storage and the Distribution app serving it.
type backend struct {
	app    *handlers.App
	driver storagedriver.StorageDriver
	ns     distribution.Namespace
	// gcMu: writes to this storage hold it shared for their request, its GC pass
	// exclusively, so a sweep never deletes the blobs of a push in flight (in this
	// process; see GC). One per storage: a pass over an organization's bucket holds up
	// the pushes to that bucket only.
	gcMu sync.RWMutex
}

// openBackend opens storage typ with params behind a Distribution app.
func openBackend(ctx context.Context, typ string, params map[string]any, uploadSecret string) (b *backend, err error) {
	conf := &configuration.Configuration{}
	conf.Storage = configuration.Storage{typ: params,
		// Blobs are served through us, never by a redirect to the bucket (runners may not
		// reach it, and a presigned URL would bypass the organization check).
		"redirect": configuration.Parameters{"disable": true},
	}
	conf.HTTP.Secret = uploadSecret
	conf.HTTP.RelativeURLs = true
	conf.Log.AccessLog.Disabled = true
	defer func() {
		// NewApp panics on configuration errors.
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("registry: %v", p)
		}
	}()
	app := handlers.NewApp(ctx, conf)
	driver, err := factory.Create(ctx, typ, params)
	if err != nil {
		_ = app.Shutdown()
		return nil, fmt.Errorf("registry: storage: %w", err)
	}
	ns, err := storage.NewRegistry(ctx, driver, storage.EnableDelete)
	if err != nil {
		_ = app.Shutdown()
		return nil, fmt.Errorf("registry: %w", err)
	}
	return &backend{app: app, driver: driver, ns: ns}, nil
}

func storageParams(cfg Config) (string, map[string]any, error) {
	switch {
	case cfg.Dir != "" && cfg.S3 != nil:
		return "", nil, errors.New("registry: storage: dir and s3 are exclusive")
	case cfg.Dir != "":
		if !path.IsAbs(cfg.Dir) {
			return "", nil, fmt.Errorf("registry: storage dir %q must be absolute", cfg.Dir)
		}
		return "filesystem", map[string]any{"rootdirectory": cfg.Dir}, nil
	case cfg.S3 != nil:
		return s3Params(cfg.S3)
	}
	return "", nil, errors.New("registry: storage: one of dir or s3 is required")
}

// s3Params are the s3-aws driver's parameters for c (objects under S3Prefix).
func s3Params(c *s3.Config) (string, map[string]any, error) {
	{
		if err := c.Validate(); err != nil {
			return "", nil, fmt.Errorf("registry: %w", err)
		}
		if c.CAFile != "" {
			return "", nil, errors.New("registry: an S3 CA file is not supported by the registry's S3 driver: use a publicly trusted certificate or a directory store")
		}
		scheme := "https://"
		if c.Insecure {
			scheme = "http://"
		}
		region := c.Region
		if region == "" {
			region = "us-east-1"
		}
		return limitedS3Driver, map[string]any{
			"accesskey": c.AccessKey, "secretkey": c.SecretKey, "bucket": c.Bucket,
			"region": region, "regionendpoint": scheme + c.Endpoint,
			"forcepathstyle": c.PathStyle, "secure": !c.Insecure, "rootdirectory": S3Prefix,
		}, nil
	}
}

// slogHook forwards logrus entries to an slog logger.
type slogHook struct{ log *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	level := slog.LevelWarn
	if e.Message == "response completed with error" {
		level = slog.LevelDebug // the client's error, answered
	}
	args := make([]any, 0, 2*len(e.Data))
	for k, v := range e.Data {
		args = append(args, k, v)
	}
	h.log.Log(context.Background(), level, "registry: "+e.Message, args...)
	return nil
}

func derive(key []byte, purpose string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("sandboxd registry " + purpose))
	return hex.EncodeToString(m.Sum(nil))
}

// Close stops the registry's background work (upload purging).
func (r *Registry) Close() {
	_ = r.platform.app.Shutdown()
	r.orgs.closeAll()
}

// MintPullToken returns a pull-only token for org's repositories, valid for ttl.
func (r *Registry) MintPullToken(org string, ttl time.Duration) (string, error) {
	return r.tokens.mint(org, ScopePull, ttl)
}

// MintPushToken returns a pull and push token for org's repositories (image builds).
func (r *Registry) MintPushToken(org string, ttl time.Duration) (string, error) {
	return r.tokens.mint(org, ScopePush, ttl)
}

// PullCredentials returns credentials for a runner to pull image (a reference) for org:
// a fresh pull token when the image names this registry's Host, ok false otherwise.
func (r *Registry) PullCredentials(org, image string) (username, password string, ok bool) {
	if r.cfg.Host == "" {
		return "", "", false
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil || reference.Domain(named) != r.cfg.Host {
		return "", "", false
	}
	tok, err := r.MintPullToken(org, DefaultPullTokenTTL)
	if err != nil {
		return "", "", false
	}
	return "sandboxd", tok, true
}

// identity is an authenticated caller.
type identity struct {
	org  string
	push bool
}

var (
	errNoCredentials  = errors.New("no credentials")
	errBadCredentials = errors.New("invalid credentials")
)

// authenticate reads the Authorization header only.
func (r *Registry) authenticate(h http.Header) (identity, error) {
	v := h.Get("Authorization")
	secret, ok := auth.BearerToken(v)
	if !ok {
		_, pass, basic := (&http.Request{Header: http.Header{"Authorization": {v}}}).BasicAuth()
		if !basic || pass == "" {
			return identity{}, errNoCredentials
		}
		secret = pass
	}
	if strings.HasPrefix(secret, tokenPrefix) {
		c, err := r.tokens.check(secret)
		if err != nil {
			return identity{}, errBadCredentials
		}
		return identity{org: c.org, push: c.scope == ScopePush}, nil
	}
	if len(secret) > maxKeyBytes {
		return identity{}, errBadCredentials
	}
	p, err := r.cfg.Auth.Authenticate(secret)
	if errors.Is(err, auth.ErrInvalidKey) {
		return identity{}, errBadCredentials
	}
	if err != nil {
		return identity{}, err
	}
	return identity{org: p.Org, push: p.Role == auth.RoleAdmin}, nil
}

// ServeHTTP authenticates, scopes to the caller's organization and hands the request to
// Distribution.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	id, err := r.authenticate(req.Header)
	switch {
	case errors.Is(err, errNoCredentials), errors.Is(err, errBadCredentials):
		w.Header().Set("WWW-Authenticate", `Basic realm="sandboxd registry"`)
		serveError(w, errcode.ErrorCodeUnauthorized.WithMessage("authentication required: an API key or a registry token as the password (Basic) or Bearer"))
		return
	case err != nil:
		r.cfg.Logger.Warn("registry: cannot check credentials", "err", err)
		serveError(w, errcode.ErrorCodeUnavailable.WithMessage("cannot check credentials now"))
		return
	}
	var m mux.RouteMatch
	if !r.router.Match(req, &m) || m.Route == nil {
		serveError(w, errcode.ErrorCodeUnsupported.WithMessage("no such registry endpoint"))
		return
	}
	switch m.Route.GetName() {
	case v2.RouteNameBase:
		r.platform.app.ServeHTTP(w, req)
		return
	case v2.RouteNameCatalog:
		serveError(w, errcode.ErrorCodeUnsupported.WithMessage("the catalog is not served"))
		return
	}
	if !r.inOrg(id, m.Vars["name"]) {
		serveError(w, errcode.ErrorCodeNameUnknown.WithDetail(map[string]string{"name": m.Vars["name"]}))
		return
	}
	// A cross-repository blob mount reads its source: it must be the caller's too. The
	// query is read, never a form body.
	if from := req.URL.Query().Get("from"); from != "" && !r.inOrg(id, from) {
		serveError(w, errcode.ErrorCodeNameUnknown.WithDetail(map[string]string{"name": from}))
		return
	}
	// The organization's storage: its own bucket (CUSTOMER_OWNED) or the platform's.
	b, err := r.backendFor(req.Context(), id.org, req.Method != http.MethodGet && req.Method != http.MethodHead)
	if err != nil {
		r.cfg.Logger.Warn("registry: organization storage unavailable", "org", id.org, "err", err)
		serveError(w, errcode.ErrorCodeUnavailable.WithMessage("the organization's build storage cannot be used now"))
		return
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		if !id.push {
			serveError(w, errcode.ErrorCodeDenied.WithMessage("this credential may only pull (push needs an SANDBOX_ADMIN key or a push token)"))
			return
		}
		// A blob is bounded as a whole: a chunk may bring what the upload (its signed
		// state says how far it is) has left of MaxUploadBytes.
		room := r.cfg.MaxUploadBytes
		if m.Route.GetName() == v2.RouteNameBlobUploadChunk {
			if off, ok := r.uploadOffset(req.URL.Query().Get("_state"), m.Vars["name"]); ok {
				room -= off
			}
		}
		if room <= 0 || req.ContentLength > room {
			serveError(w, errcode.ErrorCodeSizeInvalid.WithMessage(fmt.Sprintf("a blob is limited to %d bytes", r.cfg.MaxUploadBytes)))
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, room)
		b.gcMu.RLock()
		defer b.gcMu.RUnlock()
	}
	if b != r.platform && readsImage(req.Method, m.Route.GetName()) {
		// An image pushed before the organization's storage moved to its own bucket is
		// still read from the platform storage (orgstorage.go).
		if served := serveUnlessMissing(w, req, b.app); served {
			return
		}
		r.platform.app.ServeHTTP(w, req)
		return
	}
	b.app.ServeHTTP(w, req)
}

// uploadOffset is how many bytes the upload of state (Distribution's "_state" query
// parameter, signed with our upload-state secret) has received; ok false when it is not
// a valid state of repository name (Distribution then refuses the request itself).
func (r *Registry) uploadOffset(state, name string) (int64, bool) {
	if state == "" || len(state) > 4096 {
		return 0, false
	}
	b, err := base64.URLEncoding.DecodeString(state)
	if err != nil || len(b) < sha256.Size {
		return 0, false
	}
	m := hmac.New(sha256.New, []byte(r.uploadSecret))
	m.Write(b[sha256.Size:])
	if !hmac.Equal(m.Sum(nil), b[:sha256.Size]) {
		return 0, false
	}
	var st struct {
		Name   string
		Offset int64
	}
	if json.Unmarshal(b[sha256.Size:], &st) != nil || st.Name != name || st.Offset < 0 {
		return 0, false
	}
	return st.Offset, true
}

// inOrg reports whether repository name is one of id's organization's.
func (r *Registry) inOrg(id identity, name string) bool {
	org, rest, ok := strings.Cut(name, "/")
	return ok && rest != "" && org == id.org && orgRE.MatchString(org)
}

func serveError(w http.ResponseWriter, err error) {
	_ = errcode.ServeJSON(w, err)
}

// RepositoryName is org's repository name: "<org>/<name>", or an error when it is not a
// valid one (Distribution's grammar and length).
func RepositoryName(org, name string) (string, error) {
	if !orgRE.MatchString(org) {
		return "", fmt.Errorf("organization %q cannot own repositories (must match %s)", org, orgRE)
	}
	full := org + "/" + name
	if _, err := reference.WithName(full); err != nil {
		return "", fmt.Errorf("repository %q: %w", full, err)
	}
	return full, nil
}

// HostOf is the host[:port] of a base URL ("http://127.0.0.1:8080" → "127.0.0.1:8080").
func HostOf(baseURL string) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("registry host: %q is not a URL with a host", baseURL)
	}
	return u.Host, nil
}
