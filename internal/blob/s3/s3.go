// Package s3 is the blob store on any S3-compatible service (AWS S3, SeaweedFS, Ceph RGW,
// Garage, …) through github.com/minio/minio-go/v7 (Apache-2.0).
//
// The sha256 of an object's content is recorded as its user metadata (x-amz-meta-sha256)
// and checked on Get. S3 takes metadata before the content, and Put streams content of
// unknown length (multipart, one PartSize buffer at a time), so the hash is known only at
// the end: Put uploads to a staging key under ".staging/<digest of the key>/" (a key
// ValidateKey never accepts, so no caller's key collides and List never shows it; Delete
// of the key removes what a killed Put left there), then copies it server-side
// to the key with the metadata (one request up to 5 GiB, multipart copy above) and
// deletes the staging object. The copy is atomic: a reader sees the old object or the new
// one, never a part, and never one without its sha256.
package s3

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sandboxd/sandboxd/internal/blob"
)

// shaMeta is the user-metadata key holding the content's hex sha256.
const shaMeta = "Sandboxd-Sha256"

// stagingPrefix holds uploads in flight; '.' starts no valid key.
const stagingPrefix = ".staging/"

// DefaultPartSize is the multipart part size when Config.PartSize is 0: Put holds one
// part in memory at a time; the largest object is 10000 parts (about 156 GiB at 16 MiB).
const DefaultPartSize = 16 << 20

// Config says where the store is. Validate checks it without touching the network or
// the file system.
type Config struct {
	// Endpoint is host[:port] of the S3 API, no scheme ("s3.us-east-1.amazonaws.com",
	// "127.0.0.1:8333").
	Endpoint string
	// Bucket must exist; New does not create it.
	Bucket string
	// Region, optional ("" lets the client discover it).
	Region string
	// AccessKey and SecretKey are the static credentials.
	AccessKey, SecretKey string
	// PathStyle addresses the bucket as endpoint/bucket rather than bucket.endpoint (most
	// self-hosted services need it).
	PathStyle bool
	// Insecure talks plain HTTP (loopback and tests only); otherwise HTTPS.
	Insecure bool
	// CAFile, optional, is a PEM bundle trusted for the endpoint's certificate instead of
	// the system roots. Not with Insecure.
	CAFile string
	// PartSize is the multipart part size in bytes (0: DefaultPartSize; 5 MiB..5 GiB).
	PartSize int64
}

var (
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	regionRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
)

// ErrNoSuchBucket: New found no bucket of the configured name.
var ErrNoSuchBucket = errors.New("bucket does not exist")

// BucketNameProblem says what breaks S3's bucket naming rules in name ("" if nothing):
// stricter than Validate's check, for bucket names a caller chose (an organization's
// own snapshot bucket).
func BucketNameProblem(name string) string {
	switch {
	case !bucketRE.MatchString(name):
		return "must be 3 to 63 of [a-z0-9.-], starting and ending with a letter or digit"
	case strings.Contains(name, ".."), strings.Contains(name, ".-"), strings.Contains(name, "-."):
		return "must not have adjacent periods, or a period next to a hyphen"
	case strings.HasPrefix(name, "xn--"), strings.HasPrefix(name, "sthree-"):
		return "must not start with xn-- or sthree-"
	case strings.HasSuffix(name, "-s3alias"), strings.HasSuffix(name, "--ol-s3"):
		return "must not end with -s3alias or --ol-s3"
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return "must not be an IP address"
	}
	return ""
}

// Validate reports the first thing wrong with c, naming the field.
func (c Config) Validate() error {
	if c.Endpoint == "" {
		return errors.New("s3 config: endpoint: required")
	}
	if strings.Contains(c.Endpoint, "://") || strings.ContainsAny(c.Endpoint, "/?#@ ") {
		return fmt.Errorf("s3 config: endpoint %q: want host[:port], no scheme or path", c.Endpoint)
	}
	host, port := c.Endpoint, ""
	if h, p, err := net.SplitHostPort(c.Endpoint); err == nil {
		host, port = h, p
	}
	if host == "" || len(host) > 253 {
		return fmt.Errorf("s3 config: endpoint %q: bad host", c.Endpoint)
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("s3 config: endpoint %q: bad port", c.Endpoint)
		}
	}
	if !bucketRE.MatchString(c.Bucket) || strings.Contains(c.Bucket, "..") {
		return fmt.Errorf("s3 config: bucket %q: want 3-63 of [a-z0-9.-], starting and ending with a letter or digit", c.Bucket)
	}
	if c.Region != "" && !regionRE.MatchString(c.Region) {
		return fmt.Errorf("s3 config: region %q: want [a-z0-9-]", c.Region)
	}
	if c.AccessKey == "" || c.SecretKey == "" {
		return errors.New("s3 config: access key and secret key: required")
	}
	if len(c.AccessKey) > 256 || len(c.SecretKey) > 256 {
		return errors.New("s3 config: access key or secret key: longer than 256 bytes")
	}
	if c.Insecure && c.CAFile != "" {
		return errors.New("s3 config: ca file: set with insecure (plain HTTP has no certificate)")
	}
	if c.PartSize != 0 && (c.PartSize < 5<<20 || c.PartSize > 5<<30) {
		return fmt.Errorf("s3 config: part size %d: want 5 MiB..5 GiB", c.PartSize)
	}
	return nil
}

// Store is a blob.Store in one S3 bucket.
type Store struct {
	c        *minio.Client
	bucket   string
	partSize uint64
}

var _ blob.Store = (*Store)(nil)

// New connects to cfg's bucket and checks that it exists.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr, err := minio.DefaultTransport(!cfg.Insecure)
	if err != nil {
		return nil, err
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("s3: ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("s3: ca file %s: no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       !cfg.Insecure,
		Region:       cfg.Region,
		BucketLookup: lookup,
		Transport:    http.RoundTripper(tr),
	})
	if err != nil {
		return nil, fmt.Errorf("s3: %w", err)
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		return nil, fmt.Errorf("s3: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, ErrNoSuchBucket)
	}
	ps := uint64(cfg.PartSize)
	if ps == 0 {
		ps = DefaultPartSize
	}
	return &Store{c: c, bucket: cfg.Bucket, partSize: ps}, nil
}

func notFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

func (s *Store) wrap(op, key string, err error) error {
	if notFound(err) {
		return fmt.Errorf("%w: %s", blob.ErrNotFound, key)
	}
	var er minio.ErrorResponse
	if errors.As(err, &er) && er.Code == minio.NoSuchBucket {
		return fmt.Errorf("s3: %s %s: bucket %s: %w", op, key, s.bucket, ErrNoSuchBucket)
	}
	return fmt.Errorf("s3: %s %s: %w", op, key, err)
}

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	staging := stagingOf(key) + hex.EncodeToString(rnd[:])
	// Best effort: a failed or cancelled Put leaves no staging object (minio-go aborts
	// its multipart upload). A killed process can leave both: Delete of the key removes
	// them.
	defer func() {
		_ = s.c.RemoveObject(context.WithoutCancel(ctx), s.bucket, staging, minio.RemoveObjectOptions{})
	}()
	sr := blob.NewSizedReader(r, size)
	// size -1 to minio whatever the caller declared: SizedReader enforces the declared
	// size, and minio streams unknown sizes in PartSize parts.
	up, err := s.c.PutObject(ctx, s.bucket, staging, sr, -1, minio.PutObjectOptions{
		PartSize:    s.partSize,
		ContentType: "application/octet-stream",
	})
	if err != nil {
		return blob.Info{}, fmt.Errorf("s3: put %s: %w", key, err)
	}
	if up.Size != sr.N() {
		return blob.Info{}, fmt.Errorf("s3: put %s: stored %d bytes of %d", key, up.Size, sr.N())
	}
	sum := sr.Sum()
	_, err = s.c.ComposeObject(ctx, minio.CopyDestOptions{
		Bucket:          s.bucket,
		Object:          key,
		ReplaceMetadata: true,
		UserMetadata:    map[string]string{shaMeta: sum},
	}, minio.CopySrcOptions{Bucket: s.bucket, Object: staging, MatchETag: up.ETag})
	if err != nil {
		return blob.Info{}, fmt.Errorf("s3: put %s: copy from staging: %w", key, err)
	}
	return blob.Info{Key: key, Size: sr.N(), SHA256: sum, ModTime: time.Now()}, nil
}

func info(key string, oi minio.ObjectInfo) (blob.Info, error) {
	sum := oi.UserMetadata[shaMeta]
	if len(sum) != 64 {
		return blob.Info{}, fmt.Errorf("%w: %s has no recorded sha256", blob.ErrCorrupt, key)
	}
	return blob.Info{Key: key, Size: oi.Size, SHA256: strings.ToLower(sum), ModTime: oi.LastModified}, nil
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	obj, err := s.c.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	oi, err := obj.Stat() // the GET itself: its headers carry the metadata
	if err != nil {
		_ = obj.Close()
		return nil, s.wrap("get", key, err)
	}
	in, err := info(key, oi)
	if err != nil {
		_ = obj.Close()
		return nil, err
	}
	return blob.VerifyReader(obj, in.Size, in.SHA256), nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	oi, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return blob.Info{}, s.wrap("stat", key, err)
	}
	return info(key, oi)
}

// stagingOf is the prefix of key's staging objects (a digest of the key: keys may be
// longer than a staging name should be), so that Delete finds what a killed Put left.
func stagingOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return stagingPrefix + hex.EncodeToString(sum[:16]) + "/"
}

// removeStaged aborts the multipart uploads of key's staging objects and removes the
// staged ones: what a Put of key left when its process was killed mid-upload (the
// runner deletes the key of an upload a restart interrupted). A Put of key still running
// fails: the Delete wins.
func (s *Store) removeStaged(ctx context.Context, key string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prefix := stagingOf(key)
	core := minio.Core{Client: s.c}
	for u := range s.c.ListIncompleteUploads(ctx, s.bucket, prefix, true) {
		if u.Err != nil {
			return s.wrap("delete", key, fmt.Errorf("list staged uploads: %w", u.Err))
		}
		err := core.AbortMultipartUpload(ctx, s.bucket, u.Key, u.UploadID)
		if err != nil && minio.ToErrorResponse(err).Code != "NoSuchUpload" {
			return fmt.Errorf("s3: delete %s: abort staged upload: %w", key, err)
		}
	}
	for oi := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if oi.Err != nil {
			return s.wrap("delete", key, fmt.Errorf("list staged objects: %w", oi.Err))
		}
		if err := s.c.RemoveObject(ctx, s.bucket, oi.Key, minio.RemoveObjectOptions{}); err != nil {
			return fmt.Errorf("s3: delete %s: remove staged object: %w", key, err)
		}
	}
	return nil
}

// Delete implements blob.Store: the object and whatever a killed Put of key left
// staged. S3 deletes a missing key without complaint, so Stat first (a Delete racing
// another Delete may both succeed).
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	if err := s.removeStaged(ctx, key); err != nil {
		return err
	}
	if _, err := s.Stat(ctx, key); err != nil && !errors.Is(err, blob.ErrCorrupt) {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return s.wrap("delete", key, err)
	}
	return nil
}

// List implements blob.Store. S3 lists in key order; each object's sha256 costs one HEAD
// (listings carry no user metadata).
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if err := blob.ValidatePrefix(prefix); err != nil {
			yield(blob.Info{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		for oi := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if oi.Err != nil {
				yield(blob.Info{}, fmt.Errorf("s3: list %q: %w", prefix, oi.Err))
				return
			}
			if blob.ValidateKey(oi.Key) != nil {
				continue // staging objects, or foreign objects no key can name
			}
			in, err := s.Stat(ctx, oi.Key)
			if errors.Is(err, blob.ErrNotFound) {
				continue // deleted since listed
			}
			if !yield(in, err) || err != nil {
				return
			}
		}
	}
}
