package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/console"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/openapi"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/store"
)

// apiServices are the services of the API port: the gateway's and the control plane's
// admin services. Its REST routes, reflection and OpenAPI document are theirs.
func apiServices() []protoreflect.ServiceDescriptor {
	return append(gateway.Services(), controlplane.AdminServices()...)
}

// newAPIServer serves handler (which serves apiServices) behind the API front (the key is
// checked from the headers before any body is read; request bodies in flight are capped)
// over HTTP/1.1 and HTTP/2 cleartext (h2c), as the official client's plaintext channel
// needs, with gRPC server reflection and, without a key, the OpenAPI document at
// openapi.Path, and the web console at console.Path (its own sessions). Headers must
// arrive within ReadHeaderTimeout, an authenticated unary body within
// apifront.DefaultBodyReadTimeout; an unauthenticated body is never read.
func newAPIServer(handler http.Handler, keys auth.Authenticator, log *slog.Logger) *http.Server {
	svcs := apiServices()
	routes, err := apifront.Routes(svcs...)
	if err != nil {
		// The annotations are compiled in: a programming error.
		panic(err)
	}
	routes = append(routes, gateway.ExtraRoutes()...)
	mux := http.NewServeMux()
	mux.Handle("/", handler)
	mux.Handle("GET "+openapi.Path, openapi.Handler())
	reflector := newReflector(svcs)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	front := apifront.New(mux, apifront.Config{Auth: keys, Public: []string{"GET /readyz", "GET /livez", "GET " + openapi.Path, "HEAD " + openapi.Path, "GET " + gateway.BuildLogPath},
		MaxMessageBytes: relay.MaxMessageBytes, Routes: routes, ClientStreaming: apifront.ClientStreaming(svcs...), Logger: log})
	// The web console (internal/console) sits beside the front, not behind it: it has
	// sessions of its own, and makes every API call through the front with the session's key.
	top := http.NewServeMux()
	top.Handle("/", front)
	con := console.New(console.Config{Auth: keys, API: front, Logger: log})
	top.Handle("/console", con)
	top.Handle(console.Path, con)
	srv := &http.Server{Handler: top, ReadHeaderTimeout: apiReadHeaderTimeout, Protocols: new(http.Protocols),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}

// newReflector is gRPC server reflection of svcs, and only of them: it lists these
// services and describes the files they are defined in and import, not the other protos
// compiled into sandboxd (runner.v1, agent.v1 and SandboxDataPlaneService, served on
// other ports), which callers of this port cannot call. Reflection works by whole files,
// so the control plane's RunnerRegistrationService (its own mTLS port), in the file of
// the admin services, is described but not listed.
// Like every call on the port it needs an API key (a reflection call is a stream whose
// body would otherwise be read unauthenticated); the descriptors are those of api/.
func newReflector(svcs []protoreflect.ServiceDescriptor) *grpcreflect.Reflector {
	files, types := new(protoregistry.Files), new(protoregistry.Types)
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if _, err := files.FindFileByPath(fd.Path()); err == nil {
			return
		}
		_ = files.RegisterFile(fd)
		for i := range fd.Extensions().Len() {
			if xt, err := protoregistry.GlobalTypes.FindExtensionByName(fd.Extensions().Get(i).FullName()); err == nil {
				_ = types.RegisterExtension(xt)
			}
		}
		for i := range fd.Imports().Len() {
			add(fd.Imports().Get(i).FileDescriptor)
		}
	}
	names := make([]string, len(svcs))
	for i, sd := range svcs {
		names[i] = string(sd.FullName())
		add(sd.ParentFile())
	}
	return grpcreflect.NewReflector(grpcreflect.NamerFunc(func() []string { return names }),
		grpcreflect.WithDescriptorResolver(files), grpcreflect.WithExtensionResolver(types))
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
// dir, the platform CA (in pkiDir), the store with the default organization and admin
// key, and API-key authentication on it.
func openPlatform(ctx context.Context, dataDir, pkiDir, storeDSN string, log *slog.Logger) (*pki.CA, store.Store, *auth.StoreAuthenticator, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, nil, nil, err
	}
	ca, err := pki.LoadOrCreateCA(pkiDir, platformCAName)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("platform CA: %w", err)
	}
	st, err := openStoreWithAdmin(ctx, dataDir, storeDSN)
	if err != nil {
		return nil, nil, nil, err
	}
	return ca, st, auth.NewStoreAuthenticator(st, log), nil
}
