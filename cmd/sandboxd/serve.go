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

	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// newAPIServer serves handler behind the API front (the key is checked from the headers
// before any body is read; request bodies in flight are capped) over HTTP/1.1 and HTTP/2
// cleartext (h2c), as the official client's plaintext channel needs. Headers must arrive
// within ReadHeaderTimeout, an authenticated unary body within
// apifront.DefaultBodyReadTimeout; an unauthenticated body is never read.
func newAPIServer(handler http.Handler, keys auth.Authenticator, log *slog.Logger) *http.Server {
	var svcs []protoreflect.ServiceDescriptor
	for _, f := range []protoreflect.FileDescriptor{sandboxv1.File_coreweave_sandbox_v1_sandbox_proto,
		sandboxv1.File_coreweave_sandbox_v1_discovery_proto, controlplanev1.File_sandboxd_controlplane_v1_controlplane_proto} {
		for i := range f.Services().Len() {
			svcs = append(svcs, f.Services().Get(i))
		}
	}
	routes, err := apifront.Routes(svcs...)
	if err != nil {
		// The annotations are compiled in: a programming error.
		panic(err)
	}
	front := apifront.New(handler, apifront.Config{Auth: keys, Public: []string{"GET /readyz"},
		MaxMessageBytes: gateway.MaxMessageBytes, Routes: routes, ClientStreaming: apifront.ClientStreaming(svcs...), Logger: log})
	srv := &http.Server{Handler: front, ReadHeaderTimeout: apiReadHeaderTimeout, Protocols: new(http.Protocols),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}

// apiReadHeaderTimeout bounds the time a client may take to send a request's headers.
const apiReadHeaderTimeout = 10 * time.Second

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
