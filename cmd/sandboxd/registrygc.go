package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/registry"
)

// registryGCConfig configures `sandboxd registry gc`: one pass of the registry's garbage
// collector, offline, against the storage and the store the gateways use. It may run
// while they serve: a pass never deletes what was written within the grace, whoever
// wrote it (registry.GC).
type registryGCConfig struct {
	dataDir, storeDSN string
	grace             time.Duration
	blob              blobFlags
	verbose           bool
}

func (c *registryGCConfig) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory of the gateway (its registry storage is DATA-DIR/registry without --blob-s3-*)")
	fs.StringVar(&c.storeDSN, "store", "", "store DSN: postgres://… or a SQLite file (default DATA-DIR/"+storeFile+")")
	fs.DurationVar(&c.grace, "registry-gc-grace", registry.DefaultGCGrace, "images, blobs and links written within this are kept; at least 1m")
	fs.BoolVar(&c.verbose, "v", false, "log the registry's warnings")
	c.blob.register(fs, "ignored here (the registry's storage is the S3 bucket or DATA-DIR/registry)")
}

func registryCmd(args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "gc" {
		return errors.New("usage: sandboxd registry gc --data-dir DIR [--store DSN] [--blob-s3-* …] [--registry-gc-grace 1h]")
	}
	var c registryGCConfig
	if _, err := parseFlags("registry gc", &c, args[1:]); err != nil {
		return err
	}
	if c.grace < time.Minute {
		return errors.New("--registry-gc-grace must be at least 1m")
	}
	if err := c.blob.validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := c.run(ctx)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "registry gc: deleted %d manifests, %d blobs, %d layer links\n", res.Manifests, res.Blobs, res.Links)
	return err
}

// denyAll authenticates no API key: the registry is opened for its storage only.
type denyAll struct{}

func (denyAll) Authenticate(string) (auth.Principal, error) {
	return auth.Principal{}, auth.ErrInvalidKey
}

func (c registryGCConfig) run(ctx context.Context) (registry.GCResult, error) {
	log := slog.New(slog.DiscardHandler)
	if c.verbose {
		log = newLogger(slog.LevelInfo, true)
	}
	blobCfg, _, err := c.blob.config("")
	if err != nil {
		return registry.GCResult{}, err
	}
	key := make([]byte, 32) // signs nothing: no request is served
	if _, err := rand.Read(key); err != nil {
		return registry.GCResult{}, err
	}
	cfg := registry.Config{Auth: denyAll{}, TokenKey: key, Logger: log, S3: blobCfg.S3}
	if cfg.S3 == nil {
		cfg.Dir = filepath.Join(c.dataDir, "registry")
		if _, err := os.Stat(cfg.Dir); err != nil {
			return registry.GCResult{}, fmt.Errorf("registry storage: %w", err)
		}
	}
	reg, err := registry.New(ctx, cfg)
	if err != nil {
		return registry.GCResult{}, err
	}
	defer reg.Close()
	// A store that does not exist would be created empty, and name nothing.
	if dsn := c.storeDSN; !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		if dsn == "" {
			dsn = filepath.Join(c.dataDir, storeFile)
		}
		dsn = strings.TrimPrefix(dsn, "sqlite://")
		if _, err := os.Stat(dsn); err != nil {
			return registry.GCResult{}, fmt.Errorf("store: %w", err)
		}
	}
	st, err := openStore(ctx, c.dataDir, c.storeDSN)
	if err != nil {
		return registry.GCResult{}, err
	}
	defer func() { _ = st.Close() }()
	return gateway.NewRegistryGC(reg, st, gateway.RegistryGCConfig{Grace: c.grace}, log).Pass(ctx)
}
