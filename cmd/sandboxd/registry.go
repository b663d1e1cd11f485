package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/registry"
)

// registryKeyFile (in the data dir) signs the registry's tokens and upload state.
const registryKeyFile = "registry.key"

// registryFlags configure the platform's OCI registry, served at /v2/ of the API port.
type registryFlags struct {
	enabled   bool
	host      string
	maxUpload int64
	gc        gateway.RegistryGCConfig
}

func (r *registryFlags) register(fs *flag.FlagSet, enabled bool) {
	fs.BoolVar(&r.enabled, "registry", enabled, "serve the platform's OCI registry at /v2/ of the API port (storage: the blob store's S3 bucket, or DATA-DIR/registry)")
	fs.StringVar(&r.host, "registry-host", "", "host[:port] images name the registry by (default: the --listen address, 127.0.0.1 for an unspecified host)")
	fs.Int64Var(&r.maxUpload, "registry-max-upload-bytes", registry.DefaultMaxUploadBytes, "largest blob a push may upload (in one request or in chunks)")
	fs.DurationVar(&r.gc.Interval, "registry-gc-interval", gateway.DefaultRegistryGCInterval, "how often the registry's images that no template and no live sandbox names are deleted (0: never)")
	fs.DurationVar(&r.gc.Grace, "registry-gc-grace", registry.DefaultGCGrace, "images, blobs and links written within this are never collected (a push in progress, a build about to name its image in its template); at least 1m")
}

func (r registryFlags) validate() error {
	if r.maxUpload <= 0 {
		return errors.New("--registry-max-upload-bytes must be positive")
	}
	if r.gc.Interval < 0 {
		return errors.New("--registry-gc-interval must not be negative (0 turns collection off)")
	}
	if r.gc.Grace < time.Minute {
		return errors.New("--registry-gc-grace must be at least 1m")
	}
	return nil
}

// hostFor is the registry host for the API address listen.
func (r registryFlags) hostFor(listen string) (string, error) {
	if r.host != "" {
		if strings.ContainsAny(r.host, "/ ") {
			return "", fmt.Errorf("--registry-host %q: want host[:port]", r.host)
		}
		return r.host, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("registry host from --listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// open opens the registry (nil when disabled) on the blob store's S3 bucket, or under
// dataDir/registry without one; its key is keyDir's registryKeyFile (replicas share it).
// orgStorage answers where an organization's repositories are stored (its own bucket,
// build storage mode CUSTOMER_OWNED; nil: always the platform storage).
func (r registryFlags) open(ctx context.Context, dataDir, keyDir, host string, blobCfg blobconfig.Config, keys auth.Authenticator, orgStorage func(context.Context, string) (*s3.Config, error), log *slog.Logger) (*registry.Registry, error) {
	if !r.enabled {
		return nil, nil
	}
	key, err := pki.LoadOrCreateSecret(filepath.Join(keyDir, registryKeyFile))
	if err != nil {
		return nil, err
	}
	cfg := registry.Config{Auth: keys, TokenKey: key, MaxUploadBytes: r.maxUpload, Host: host, Logger: log, OrgStorage: orgStorage}
	if blobCfg.S3 != nil {
		cfg.S3 = blobCfg.S3
	} else {
		cfg.Dir = filepath.Join(dataDir, "registry")
	}
	reg, err := registry.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log.Info("platform registry", "host", host, "storage", map[bool]string{true: "s3", false: cfg.Dir}[cfg.S3 != nil])
	return reg, nil
}

// startGC runs the registry's garbage collector (registrygc.go of the gateway) until ctx
// is done, with the references of st; nothing when reg is nil or collection is off. Every
// gateway replica runs it: passes are safe concurrently (registry.GC).
func (r registryFlags) startGC(ctx context.Context, reg *registry.Registry, st gateway.RegistryGCStore, log *slog.Logger) {
	if reg == nil || r.gc.Interval == 0 {
		return
	}
	go gateway.NewRegistryGC(reg, st, r.gc, log).Run(ctx)
}

// withRegistry serves reg at /v2/ and api everywhere else. The registry authenticates
// from the headers itself (Basic or Bearer) and bounds its bodies: it is not behind the
// API front, which knows Bearer keys and protobuf messages only.
func withRegistry(api http.Handler, reg *registry.Registry) http.Handler {
	if reg == nil {
		return api
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2" || strings.HasPrefix(r.URL.Path, "/v2/") {
			reg.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}
