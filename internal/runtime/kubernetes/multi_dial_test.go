package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
	client, server := gateCerts(t, dir)
	idApp, idWeb, idDB := agent.NewIdentity("x"), agent.NewIdentity("x/web"), agent.NewIdentity("x/db")
	containers := filepath.Join(dir, "containers")
	// serve is an "agent" proving id on a socket, then saying reply.
	serve := func(path string, id *agentconfig.Identity, reply string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		ln := agentListener(t, path, id)
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

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &Backend{
		cfg:       Config{Dial: startGate(t, ctx, dir, gate.ServeOptions{ContainersDir: containers})},
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
