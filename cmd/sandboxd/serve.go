package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// newAPIServer serves handler over HTTP/1.1 and HTTP/2 cleartext (h2c), as the official
// client's plaintext channel needs.
func newAPIServer(handler http.Handler) *http.Server {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}

// serveUntilDone serves srv on ln (TLS when srv.TLSConfig is set) until ctx ends, then
// logs bye and shuts down gracefully within 5 s.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger, bye string) error {
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
	}
	if bye != "" {
		log.Info(bye)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}

// openPlatform prepares what the control plane and the gateway processes share: the data
// dir, the platform CA (in *pkiDir, default DATA-DIR/pki), the store with the default
// organization and admin key, and API-key authentication on it.
func openPlatform(ctx context.Context, dataDir string, pkiDir *string, storeDSN string, log *slog.Logger) (*pki.CA, store.Store, *auth.StoreAuthenticator, error) {
	if *pkiDir == "" {
		*pkiDir = filepath.Join(dataDir, "pki")
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, nil, nil, err
	}
	ca, err := pki.LoadOrCreateCA(*pkiDir, platformCAName)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("platform CA: %w", err)
	}
	st, err := openStoreWithAdmin(ctx, dataDir, storeDSN)
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, st, auth.NewStoreAuthenticator(st, log), nil
}
