package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// TestDialAgentByContainer: DialAgent reaches each container's agent through the gate
// by name, and verifies that container's own identity: an agent of another container
// answering under a sidecar's name (a container relaying its socket to another agent) is
// refused; an unknown name wraps ErrContainerNotFound; an init container has no agent.
func TestDialAgentByContainer(t *testing.T) {
	dir := t.TempDir()
	client, clientPEM, _, err := selfSigned("sandboxd-runner")
	if err != nil {
		t.Fatal(err)
	}
	server, serverPEM, serverKeyPEM, err := selfSigned("sandbox-x")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": serverPEM, "tls.key": serverKeyPEM, "client.crt": clientPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	idApp, idWeb, idDB := agent.NewIdentity("x"), agent.NewIdentity("x/web"), agent.NewIdentity("x/db")
	containers := filepath.Join(dir, "containers")
	// serve is an "agent" proving id on a socket, then saying reply.
	serve := func(path string, id *agentconfig.Identity, reply string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		raw, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := agent.WithIdentity(raw, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					_, _ = c.Write([]byte(reply))
				}()
			}
		}()
	}
	serve(filepath.Join(dir, "primary.sock"), idApp, "app")
	serve(filepath.Join(containers, "db", gate.Socket), idDB, "db")
	// web's socket leads to an agent proving app's identity.
	serve(filepath.Join(containers, "web", gate.Socket), idApp, "app-as-web")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = gate.Serve(ctx, gate.ServeOptions{
			Listen: addr, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
			ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: filepath.Join(dir, "primary.sock"),
			ContainersDir: containers, DialTimeout: time.Second,
		})
	}()
	b := &Backend{
		cfg: Config{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			for i := 0; ; i++ {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err == nil || i > 50 {
					return c, err
				}
				time.Sleep(20 * time.Millisecond)
			}
		}},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{},
	}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "i"},
		Sidecars:       []runtime.Container{{Name: "web", Image: "i"}, {Name: "db", Image: "i"}},
		InitContainers: []runtime.Container{{Name: "setup", Image: "i"}}}
	b.sandboxes["x"] = &sandbox{
		id: "x", spec: spec, client: client, server: server.Certificate[0], ident: idApp,
		idents:  map[string]*agentconfig.Identity{"app": idApp, "web": idWeb, "db": idDB},
		pod:     &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
		changed: make(chan struct{}), done: make(chan struct{}),
	}
	read := func(container string) (string, error) {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		c, err := b.DialAgent(dctx, "x", container)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		out, err := io.ReadAll(c)
		return string(out), err
	}
	for name, want := range map[string]string{"": "app", "app": "app", "db": "db"} {
		if got, err := read(name); err != nil || got != want {
			t.Errorf("container %q: %q, %v; want %q", name, got, err, want)
		}
	}
	if got, err := read("web"); !errors.Is(err, agent.ErrIdentity) {
		t.Errorf("web's name led to app's agent: %q, %v; want an identity error", got, err)
	}
	if _, err := read("nope"); !errors.Is(err, runtime.ErrContainerNotFound) {
		t.Errorf("unknown container: %v", err)
	}
	if _, err := read("setup"); err == nil || errors.Is(err, runtime.ErrContainerNotFound) {
		t.Errorf("init container: %v", err)
	}
}
