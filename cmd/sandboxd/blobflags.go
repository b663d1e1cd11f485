package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// blobFlags choose the blob store (file-system snapshots) of `runner`, `gateway` and
// `dev`: a directory (--blob-dir; one process opens a root, so processes that share a
// store use S3) or an S3-compatible service (--blob-s3-*). The S3 credentials come from
// files (--blob-s3-access-key-file, --blob-s3-secret-key-file), never the command line,
// as other secrets of sandboxd do.
type blobFlags struct {
	dir                                     string
	endpoint, bucket, region                string
	accessKeyFile, secretKeyFile            string
	caFile                                  string
	pathStyle, insecure                     bool
	snapshotsPerSandbox, snapshotsPerRunner int
}

func (b *blobFlags) register(fs *flag.FlagSet, dirHelp string) {
	fs.StringVar(&b.dir, "blob-dir", "", "directory of the blob store holding file-system snapshots, "+dirHelp+" (one process opens it; not with --blob-s3-endpoint)")
	fs.StringVar(&b.endpoint, "blob-s3-endpoint", "", "host[:port] of an S3-compatible blob store for file-system snapshots (instead of --blob-dir)")
	fs.StringVar(&b.bucket, "blob-s3-bucket", "", "bucket of the S3 blob store (must exist)")
	fs.StringVar(&b.region, "blob-s3-region", "", "region of the S3 blob store (default: discovered)")
	fs.StringVar(&b.accessKeyFile, "blob-s3-access-key-file", "", "file holding the S3 access key ID")
	fs.StringVar(&b.secretKeyFile, "blob-s3-secret-key-file", "", "file holding the S3 secret access key")
	fs.BoolVar(&b.pathStyle, "blob-s3-path-style", false, "address the bucket as ENDPOINT/BUCKET (most self-hosted S3 services need it)")
	fs.BoolVar(&b.insecure, "blob-s3-insecure", false, "talk plain HTTP to the S3 endpoint (loopback and tests only)")
	fs.StringVar(&b.caFile, "blob-s3-ca-file", "", "PEM bundle to trust for the S3 endpoint's certificate instead of the system roots")
}

// registerRunner adds the runner's snapshot limits.
func (b *blobFlags) registerRunner(fs *flag.FlagSet) {
	fs.IntVar(&b.snapshotsPerSandbox, "snapshots-per-sandbox", runner.DefaultSnapshotsPerSandbox, "file-system snapshots one sandbox may have in flight (captured, not yet uploaded)")
	fs.IntVar(&b.snapshotsPerRunner, "snapshots-per-runner", runner.DefaultSnapshotsPerRunner, "file-system snapshots the runner uploads at once")
}

// s3Given: an S3 flag was set.
func (b blobFlags) s3Given() bool {
	return b.endpoint != "" || b.bucket != "" || b.region != "" || b.accessKeyFile != "" || b.secretKeyFile != "" ||
		b.caFile != "" || b.pathStyle || b.insecure
}

// configured: a blob store was chosen.
func (b blobFlags) configured() bool { return b.dir != "" || b.s3Given() }

// shape is the configuration without its secrets (placeholders for the key files'
// contents), for validate.
func (b blobFlags) shape(keys func(file string) (string, error)) (blobconfig.Config, error) {
	if !b.s3Given() {
		return blobconfig.Config{Dir: b.dir}, nil
	}
	if b.endpoint == "" {
		return blobconfig.Config{}, errors.New("--blob-s3-*: --blob-s3-endpoint is required")
	}
	if b.accessKeyFile == "" || b.secretKeyFile == "" {
		return blobconfig.Config{}, errors.New("--blob-s3-endpoint needs --blob-s3-access-key-file and --blob-s3-secret-key-file")
	}
	access, err := keys(b.accessKeyFile)
	if err != nil {
		return blobconfig.Config{}, fmt.Errorf("--blob-s3-access-key-file: %w", err)
	}
	secret, err := keys(b.secretKeyFile)
	if err != nil {
		return blobconfig.Config{}, fmt.Errorf("--blob-s3-secret-key-file: %w", err)
	}
	return blobconfig.Config{Dir: b.dir, S3: &s3.Config{Endpoint: b.endpoint, Bucket: b.bucket, Region: b.region,
		AccessKey: access, SecretKey: secret, PathStyle: b.pathStyle, Insecure: b.insecure, CAFile: b.caFile}}, nil
}

// validate checks the flags without reading the key files (pure).
func (b blobFlags) validate() error {
	if b.snapshotsPerSandbox < 0 || b.snapshotsPerRunner < 0 {
		return errors.New("--snapshots-per-sandbox and --snapshots-per-runner must not be negative")
	}
	if !b.configured() {
		return nil
	}
	cfg, err := b.shape(func(string) (string, error) { return "placeholder", nil })
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--blob-*: %w", err)
	}
	return nil
}

// config is the store the flags choose, its S3 keys read from their files; a dir store
// at defaultDir when none is chosen and defaultDir is not "" (dev), else ok is false.
func (b blobFlags) config(defaultDir string) (cfg blobconfig.Config, ok bool, err error) {
	if !b.configured() {
		if defaultDir == "" {
			return blobconfig.Config{}, false, nil
		}
		b.dir = defaultDir
	}
	cfg, err = b.shape(readKeyFile)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return blobconfig.Config{}, false, err
	}
	return cfg, true, nil
}

// open opens the store the flags choose (config); nil and the zero Config without one.
func (b blobFlags) open(ctx context.Context, defaultDir string) (store blob.Store, cfg blobconfig.Config, closeStore func(), err error) {
	cfg, ok, err := b.config(defaultDir)
	if err != nil || !ok {
		return nil, blobconfig.Config{}, func() {}, err
	}
	st, err := cfg.Open(ctx)
	if err != nil {
		return nil, blobconfig.Config{}, nil, fmt.Errorf("blob store: %w", err)
	}
	closeStore = func() {}
	if c, ok := st.(io.Closer); ok {
		closeStore = func() { _ = c.Close() }
	}
	return st, cfg, closeStore, nil
}

// readKeyFile is a credential file's content without surrounding white space, at most
// 4 KiB.
func readKeyFile(file string) (string, error) {
	f, err := os.Open(filepath.Clean(file))
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10+1))
	if err != nil {
		return "", err
	}
	if len(b) > 4<<10 {
		return "", errors.New("larger than 4 KiB: not a key")
	}
	k := strings.TrimSpace(string(b))
	if k == "" {
		return "", errors.New("empty")
	}
	return k, nil
}

// blobStore is an opened store with the runner's snapshot limits, as the backends' stacks
// take them.
type blobStore struct {
	store                 blob.Store
	cfg                   blobconfig.Config
	perSandbox, perRunner int
}
