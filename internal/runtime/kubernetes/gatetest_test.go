package kubernetes

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// gateCerts writes a gate's certificate files into dir, as a Pod's Secret holds them:
// tls.crt and tls.key (the sandbox's server certificate) and client.crt (the runner's,
// the only client certificate the gate accepts). It returns the runner's client
// certificate and the gate's server certificate.
func gateCerts(t *testing.T, dir string) (client, server tls.Certificate) {
	t.Helper()
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
	return client, server
}

// agentListener listens on the unix socket path as an agent proving id does.
func agentListener(t *testing.T, path string, id *agentconfig.Identity) net.Listener {
	t.Helper()
	raw, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := agent.WithIdentity(raw, id)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startGate runs a real gate (gate.Serve) on a free loopback port until ctx ends, with
// the certificates gateCerts wrote into dir and the primary's agent at
// dir/primary.sock; opts gives the rest (ContainersDir, HoldFor; DialTimeout default
// 1 s). It returns a Config.Dial that reaches the gate, retrying while it starts.
func startGate(t *testing.T, ctx context.Context, dir string, opts gate.ServeOptions) func(ctx context.Context, network, addr string) (net.Conn, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	opts.Listen = addr
	opts.CertFile, opts.KeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	opts.ClientCertFile, opts.Upstream = filepath.Join(dir, "client.crt"), filepath.Join(dir, "primary.sock")
	if opts.DialTimeout == 0 {
		opts.DialTimeout = time.Second
	}
	go func() { _ = gate.Serve(ctx, opts) }()
	return func(ctx context.Context, _, _ string) (net.Conn, error) { return dialRetrying(ctx, addr) }
}

// dialRetrying dials addr over TCP, retrying for about a second while a gate just
// started begins to listen.
func dialRetrying(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	for i := 0; ; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil || i > 50 {
			return c, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
