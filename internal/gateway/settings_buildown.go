package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/minio/minio-go/v7"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/secretbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// An organization's own build storage (build storage mode CUSTOMER_OWNED; docs/builds.md,
// "Build storage settings"): the organization's repositories of the platform registry are
// stored in an S3 bucket of its own (registry.Config.OrgStorage asks OrgBuildStorage).
//
//   - Endpoints: only those the platform's administrator allows
//     (BuildOptions.StorageEndpoints, `--build-storage-endpoints`); `location` is one of
//     them (host[:port]), empty when exactly one is allowed. The gateway never connects
//     to a host a caller names.
//   - Credentials: from the organization's built-in secret store BuildStorageSecretStore,
//     path BuildStorageSecretPath, fields access_key_id and secret_access_key (an admin
//     puts them with PutSecret). That store is never given to a sandbox (resolveSecret
//     refuses it), and the values are never returned, logged or stored elsewhere.
//   - An update to CUSTOMER_OWNED is stored only once a probe object was written, read
//     back and deleted in the bucket with those credentials.

// The secret-store convention of an organization's build storage credentials.
const (
	BuildStorageSecretStore = "sandboxd-build-storage"
	BuildStorageSecretPath  = "s3"
	buildStorageAccessKey   = "access_key_id"
	buildStorageSecretKey   = "secret_access_key"
	// maxBuildStorageEndpoints bounds --build-storage-endpoints.
	maxBuildStorageEndpoints = 32
	// buildStorageProbeTimeout bounds the probe of an own bucket.
	buildStorageProbeTimeout = 15 * time.Second
	// buildStorageProbePrefix is where the probe object is written (and deleted).
	buildStorageProbePrefix = "sandboxd-probe/"
)

// BuildStorageEndpoint is an S3 endpoint organizations may keep their build storage at.
type BuildStorageEndpoint struct {
	// Host is host[:port], what `location` names.
	Host string
	// Insecure: plain HTTP (loopback and tests); otherwise HTTPS with the system roots.
	Insecure bool
	// Region signs the requests ("" : us-east-1).
	Region string
}

// ParseBuildStorageEndpoints reads `--build-storage-endpoints`: comma-separated
// `[http://|https://]host[:port][=region]` (https by default), at most 32.
func ParseBuildStorageEndpoints(v string) ([]BuildStorageEndpoint, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []BuildStorageEndpoint
	seen := map[string]bool{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		var e BuildStorageEndpoint
		if h, r, ok := strings.Cut(item, "="); ok {
			item, e.Region = h, r
		}
		switch {
		case strings.HasPrefix(item, "http://"):
			e.Insecure, item = true, strings.TrimPrefix(item, "http://")
		case strings.HasPrefix(item, "https://"):
			item = strings.TrimPrefix(item, "https://")
		}
		e.Host = item
		if _, _, err := net.SplitHostPort(item); err != nil && strings.Contains(item, ":") {
			return nil, fmt.Errorf("--build-storage-endpoints %q: want host[:port] (an IPv6 address in brackets)", textclip.Clip(item, 64))
		}
		// Validate the endpoint as the S3 client will use it.
		c := s3.Config{Endpoint: e.Host, Bucket: "probe", Region: e.Region, AccessKey: "x", SecretKey: "x", Insecure: e.Insecure}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("--build-storage-endpoints %q: %w", textclip.Clip(item, 64), err)
		}
		if seen[e.Host] {
			return nil, fmt.Errorf("--build-storage-endpoints: %q twice", e.Host)
		}
		seen[e.Host] = true
		out = append(out, e)
	}
	if len(out) > maxBuildStorageEndpoints {
		return nil, fmt.Errorf("--build-storage-endpoints: %d endpoints, at most %d", len(out), maxBuildStorageEndpoints)
	}
	return out, nil
}

func customerOwned(mode int32) bool {
	return mode == int32(sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED)
}

// storageEndpoint is the allowed endpoint location names ("" : the only one allowed).
func (s *Server) storageEndpoint(location string) (BuildStorageEndpoint, bool) {
	var eps []BuildStorageEndpoint
	if s.builds != nil {
		eps = s.builds.cfg.StorageEndpoints
	}
	if location == "" && len(eps) == 1 {
		return eps[0], true
	}
	for _, e := range eps {
		if e.Host == location {
			return e, true
		}
	}
	return BuildStorageEndpoint{}, false
}

func (s *Server) storageEndpointHosts() string {
	var hs []string
	if s.builds != nil {
		for _, e := range s.builds.cfg.StorageEndpoints {
			hs = append(hs, e.Host)
		}
	}
	return strings.Join(hs, ", ")
}

// buildStorageCredentials reads org's credentials from its secret store (the
// convention above). A missing store or secret is a violation (field: the convention's
// place, as "secret_stores/<store>/secrets/<path>#<field>"); other errors are returned.
func (s *Server) buildStorageCredentials(ctx context.Context, org string) (ak, sk string, vs []apierr.Violation, err error) {
	if !s.secrets.enabled() {
		return "", "", []apierr.Violation{{Field: bscField + ".mode", Description: "CUSTOMER_OWNED takes its credentials from the organization's built-in secret store, and this gateway has no secret stores (no secret key file)"}}, nil
	}
	get := func(field string) (string, error) {
		x, err := s.secrets.Store.GetSecret(ctx, org, BuildStorageSecretStore, BuildStorageSecretPath, field)
		switch {
		case errors.Is(err, store.ErrNotFound):
			vs = append(vs, apierr.Violation{Field: fmt.Sprintf("secret_stores/%s/secrets/%s#%s", BuildStorageSecretStore, BuildStorageSecretPath, field),
				Description: fmt.Sprintf("CUSTOMER_OWNED needs the bucket's credentials in the organization's built-in secret store %q, path %q, fields %q and %q; %q is not there",
					BuildStorageSecretStore, BuildStorageSecretPath, buildStorageAccessKey, buildStorageSecretKey, field)})
			return "", nil
		case err != nil:
			return "", secretsUnavailable("the build storage credentials", err)
		}
		v, err := s.secrets.Keys.Open(x.KeyID, x.Ciphertext, secretbox.AD(org, BuildStorageSecretStore, BuildStorageSecretPath, field))
		if err != nil {
			s.log.Error("build storage credential cannot be opened", "org", org, "field", field, "key_id", x.KeyID)
			return "", connect.NewError(connect.CodeInternal, fmt.Errorf("the build storage credential %s cannot be opened with this gateway's secret key file (key ID %s)", field, x.KeyID))
		}
		return string(v), nil
	}
	if ak, err = get(buildStorageAccessKey); err != nil {
		return "", "", nil, err
	}
	if sk, err = get(buildStorageSecretKey); err != nil {
		return "", "", nil, err
	}
	return ak, sk, vs, nil
}

// ownStorage is the S3 configuration of org's own bucket at location, or the violations
// why there is none (no endpoint allowed, location not allowed, credentials missing).
func (s *Server) ownStorage(ctx context.Context, org, bucket, location string) (*s3.Config, []apierr.Violation, error) {
	ep, ok := s.storageEndpoint(location)
	if !ok {
		desc := fmt.Sprintf("%q is not an S3 endpoint this platform allows for build storage (allowed: %s)", textclip.Clip(location, 64), s.storageEndpointHosts())
		field := bscField + ".location"
		switch n := len(s.builds.cfg.StorageEndpoints); {
		case n == 0:
			field, desc = bscField+".mode", "CUSTOMER_OWNED is not available: the platform allows no S3 endpoint for organizations' build storage (gateway flag --build-storage-endpoints)"
		case location == "":
			desc = fmt.Sprintf("is required: name one of the allowed S3 endpoints (%s)", s.storageEndpointHosts())
		}
		return nil, []apierr.Violation{{Field: field, Description: desc}}, nil
	}
	ak, sk, vs, err := s.buildStorageCredentials(ctx, org)
	if err != nil || len(vs) > 0 {
		return nil, vs, err
	}
	c := &s3.Config{Endpoint: ep.Host, Bucket: bucket, Region: ep.Region, AccessKey: ak, SecretKey: sk, PathStyle: true, Insecure: ep.Insecure}
	if err := c.Validate(); err != nil {
		// Never the error's text: it may quote the configuration.
		return nil, []apierr.Violation{{Field: fmt.Sprintf("secret_stores/%s/secrets/%s", BuildStorageSecretStore, BuildStorageSecretPath),
			Description: "the credentials must be 1 to 256 bytes each"}}, nil
	}
	return c, nil, nil
}

// OrgBuildStorage is where org's repositories of the platform registry are stored: its
// own bucket when its build storage config is CUSTOMER_OWNED, nil for the platform
// storage (registry.Config.OrgStorage). An own storage that cannot be resolved now (the
// endpoint no longer allowed, the credentials gone) is an error: the registry answers
// 503 rather than writing the organization's images elsewhere.
func (s *Server) OrgBuildStorage(ctx context.Context, org string) (*s3.Config, error) {
	c, err := s.buildStorageConfig(ctx, org)
	if err != nil {
		return nil, transientStorage(err)
	}
	if !customerOwned(c.Mode) {
		return nil, nil
	}
	cfg, vs, err := s.ownStorage(ctx, org, c.Bucket, c.Location)
	if err != nil {
		return nil, transientStorage(err)
	}
	if len(vs) > 0 {
		return nil, fmt.Errorf("build storage of %s: %s", org, apierr.Describe(vs))
	}
	return cfg, nil
}

// probeOwnStorage checks that c's bucket exists and that its credentials write, read and
// delete an object there; the violation says what failed (nil: usable).
func probeOwnStorage(ctx context.Context, c *s3.Config) *apierr.Violation {
	ctx, cancel := context.WithTimeout(ctx, buildStorageProbeTimeout)
	defer cancel()
	credField := fmt.Sprintf("secret_stores/%s/secrets/%s", BuildStorageSecretStore, BuildStorageSecretPath)
	fail := func(step string, err error) *apierr.Violation {
		code := minio.ToErrorResponse(errors.Unwrap(err)).Code
		if code == "" {
			code = minio.ToErrorResponse(err).Code
		}
		switch {
		case errors.Is(err, s3.ErrNoSuchBucket) || code == minio.NoSuchBucket:
			return &apierr.Violation{Field: bscField + ".bucket_name", Description: fmt.Sprintf("bucket %q does not exist at %s", c.Bucket, c.Endpoint)}
		case code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "InvalidToken" || code == "ExpiredToken":
			return &apierr.Violation{Field: credField, Description: fmt.Sprintf("the credentials cannot %s in bucket %q at %s (%s)", step, c.Bucket, c.Endpoint, code)}
		case code != "":
			return &apierr.Violation{Field: bscField + ".bucket_name", Description: fmt.Sprintf("bucket %q at %s: %s failed (%s)", c.Bucket, c.Endpoint, step, textclip.Clip(code, 64))}
		}
		var ne net.Error
		if errors.As(err, &ne) || ctx.Err() != nil {
			return &apierr.Violation{Field: bscField + ".location", Description: fmt.Sprintf("the S3 endpoint %s cannot be reached (%s)", c.Endpoint, step)}
		}
		return &apierr.Violation{Field: bscField + ".bucket_name", Description: fmt.Sprintf("bucket %q at %s: %s failed", c.Bucket, c.Endpoint, step)}
	}
	st, err := s3.New(ctx, *c)
	if err != nil {
		return fail("check the bucket", err)
	}
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	key := buildStorageProbePrefix + hex.EncodeToString(rnd[:])
	body := []byte("sandboxd build storage probe " + key)
	if _, err := st.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		return fail("write", err)
	}
	rc, err := st.Get(ctx, key)
	if err != nil {
		_ = st.Delete(ctx, key)
		return fail("read", err)
	}
	got, err := io.ReadAll(io.LimitReader(rc, int64(len(body))+1))
	_ = rc.Close()
	if err != nil || !bytes.Equal(got, body) {
		_ = st.Delete(ctx, key)
		if err == nil {
			err = errors.New("read back other content")
		}
		return fail("read", err)
	}
	if err := st.Delete(ctx, key); err != nil {
		return fail("delete", err)
	}
	if _, err := st.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
		return fail("delete", fmt.Errorf("the probe object is still there: %w", err))
	}
	return nil
}

// checkOwnStorage validates next (CUSTOMER_OWNED) for org: the endpoint, the
// credentials and a probe of the bucket. Violations are FAILED_PRECONDITION
// CWSANDBOX_BUILD_STORAGE_UNAVAILABLE.
func (s *Server) checkOwnStorage(ctx context.Context, org string, next *store.BuildStorageConfig) error {
	unavailable := func(vs []apierr.Violation) error {
		return apierr.WithViolations(apierr.New(apierr.BuildStorageUnavailable, "the organization's build storage cannot be used: "+apierr.Describe(vs),
			map[string]string{"bucket_name": next.Bucket, "location": textclip.Clip(next.Location, 64)}), vs)
	}
	if len(s.builds.cfg.StorageEndpoints) == 0 {
		return unavailable([]apierr.Violation{{Field: bscField + ".mode", Description: "CUSTOMER_OWNED is not available: the platform allows no S3 endpoint for organizations' build storage (gateway flag --build-storage-endpoints)"}})
	}
	if next.Bucket == "" {
		vs := []apierr.Violation{{Field: bscField + ".bucket_name", Description: "is required with mode CUSTOMER_OWNED"}}
		return apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
	}
	c, vs, err := s.ownStorage(ctx, org, next.Bucket, next.Location)
	if err != nil {
		return err
	}
	if len(vs) == 0 {
		if v := probeOwnStorage(ctx, c); v != nil {
			vs = append(vs, *v)
		}
	}
	if len(vs) > 0 {
		return unavailable(vs)
	}
	next.Location = c.Endpoint // the endpoint chosen (location "" with one allowed)
	return nil
}

// maxLocation bounds location (an endpoint's host[:port]).
const maxLocation = 253 + 6

func locationProblem(l string) string {
	switch {
	case len(l) > maxLocation:
		return "is " + strconv.Itoa(len(l)) + " bytes, at most " + strconv.Itoa(maxLocation)
	case !textclip.AllPrintable(l) || strings.ContainsAny(l, " /?#@"):
		return "must be an allowed S3 endpoint's host[:port]"
	}
	return ""
}

// transientStorage marks err as registry.ErrOrgStorageTransient when it says only that
// the store or the secrets cannot be read now (CWSANDBOX_BACKEND_UNAVAILABLE, a
// deadline): the registry may then keep serving pulls from its last answer. Anything
// else (the credentials gone or undecryptable) ends the answer's use at once.
func transientStorage(err error) error {
	if apierr.Reason(err) == apierr.BackendUnavailable || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", registry.ErrOrgStorageTransient, err)
	}
	return err
}
