package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Files `sandboxd dev` keeps in its data dir; other tools rely on these names.
const (
	adminKeyFile = "admin-api-key"
	keyringFile  = "api-keys.json"
	defaultOrg   = "default"
)

// dev runs the gateway and one local runner in one process, on loopback by default.
func dev(args []string) error {
	fs := flag.NewFlagSet("dev", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	listen := fs.String("listen", "127.0.0.1:8080", "address the API listens on (gRPC, Connect, gRPC-Web over h2c)")
	runnerID := fs.String("runner-id", "local", "ID of the local runner")
	mirror := fs.Bool("test-image-mirror", true, "serve the test images (scripts/build-test-images.sh) from a loopback registry that mirrors docker.io")
	verbose := fs.Bool("v", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if _, err := pki.LoadOrCreateCA(*dataDir, "sandboxd dev CA"); err != nil {
		return fmt.Errorf("platform CA: %w", err)
	}
	keys, err := openKeyringWithAdmin(*dataDir)
	if err != nil {
		return err
	}

	cfg := stack.Config{DataDir: *dataDir, Logger: logger}
	if *mirror {
		host, stopRegistry, err := serveTestImages(ctx)
		switch {
		case errors.Is(err, testimage.ErrNoTestImages):
			logger.Warn("no test images to mirror; docker.io images are pulled from Docker Hub", "hint", "make images")
		case err != nil:
			return err
		default:
			defer stopRegistry()
			cfg.InsecureRegistries = []string{host}
			cfg.Mirrors = map[string][]image.Mirror{"docker.io": {{Host: host, Insecure: true}}}
			logger.Info("test images mirror docker.io", "registry", host)
		}
	}
	st, err := stack.NewLocal(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()

	gw, err := gateway.New(gateway.Config{
		Auth:    keys,
		Runners: []gateway.Runner{gateway.NewLocalRunner(*runnerID, st.Runner)},
		Logger:  logger,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	fmt.Printf("CWSANDBOX_BASE_URL=http://%s\n", ln.Addr())
	fmt.Printf("CWSANDBOX_API_KEY is in %s\n", filepath.Join(*dataDir, adminKeyFile))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down; sandboxes keep running and are re-adopted on the next start")
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}

// openKeyringWithAdmin opens the keyring and, on first start, creates the admin key of
// the default organization, printed once and saved 0600 for tools.
func openKeyringWithAdmin(dataDir string) (*auth.Keyring, error) {
	keys, err := auth.OpenKeyring(filepath.Join(dataDir, keyringFile))
	if err != nil {
		return nil, err
	}
	if keys.Len() > 0 {
		return keys, nil
	}
	key, _, err := keys.Create(defaultOrg, auth.RoleAdmin, "admin")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dataDir, adminKeyFile)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("save admin API key: %w", err)
	}
	fmt.Printf("admin API key (shown once, saved to %s): %s\n", path, key)
	return keys, nil
}

// serveTestImages serves the test images on loopback under their own names and under
// Docker Hub's (library/python:3.11, library/busybox:latest).
func serveTestImages(ctx context.Context) (string, func(), error) {
	imgs, err := testimage.StandardImages()
	if err != nil {
		return "", nil, err
	}
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		return "", nil, err
	}
	if err := testimage.PushStandard(host, imgs); err != nil {
		stop()
		return "", nil, err
	}
	if err := testimage.PushDockerHubNames(host, imgs); err != nil {
		stop()
		return "", nil, err
	}
	return host, stop, nil
}

// apikey manages API keys in a data dir: `sandboxd apikey create --org ORG [--role user]`.
func apikey(args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: sandboxd apikey create --data-dir DIR --org ORG [--role user|admin] [--name NAME]")
	}
	fs := flag.NewFlagSet("apikey create", flag.ExitOnError)
	dataDir := fs.String("data-dir", "/var/lib/sandboxd", "state directory")
	org := fs.String("org", defaultOrg, "organization")
	role := fs.String("role", "user", "user or admin")
	name := fs.String("name", "", "a name to recognise the key by")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	r := auth.RoleUser
	switch *role {
	case "user":
	case "admin":
		r = auth.RoleAdmin
	default:
		return fmt.Errorf("unknown role %q (user or admin)", *role)
	}
	keys, err := auth.OpenKeyring(filepath.Join(*dataDir, keyringFile))
	if err != nil {
		return err
	}
	key, _, err := keys.Create(*org, r, *name)
	if err != nil {
		return err
	}
	fmt.Println(key)
	return nil
}
