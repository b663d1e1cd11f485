package runnerapi

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRunnerapiAwaitStartSplit: in split mode a gateway's AwaitStart of a sandbox being
// created waits on the remote runner and answers RUNNING once the sandbox runs.
func TestRunnerapiAwaitStartSplit(t *testing.T) {
	f := runtimetest.NewFake()
	release := make(chan struct{})
	f.OnCreate = func(ctx context.Context, _ *runtimetest.FakeSandbox) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r, err := runner.New(context.Background(), runner.Config{Backend: f, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(r, func(context.Context) (runner.Capacity, error) { return runner.Capacity{}, nil }, nil).HTTPServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	c := (&testRunner{addr: ln.Addr().String(), ca: ca}).client(t)

	sb, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		sb  runner.Sandbox
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := c.AwaitStart(context.Background(), sb.ID, runner.MaxAwaitStart)
		done <- answer{got, err}
	}()
	close(release)
	if a := <-done; a.err != nil || a.sb.State != runner.StateRunning {
		t.Errorf("await start over the runner API: %v %v, want RUNNING", a.sb.State, a.err)
	}
}
