package runner

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// endedBackend reports one sandbox that ended while the runner was down, and fails its
// first Destroys like a teardown step that is busy for a moment.
type endedBackend struct {
	mu        sync.Mutex
	failFirst int
	destroys  int
	destroyed chan struct{}
}

func (b *endedBackend) Create(context.Context, *runtime.Spec) (runtime.Info, error) {
	return runtime.Info{}, errors.New("not used")
}
func (b *endedBackend) DialAgent(context.Context, string) (net.Conn, error) {
	return nil, errors.New("not used")
}
func (b *endedBackend) Wait(context.Context, string) (runtime.Exit, error) {
	return runtime.Exit{}, errors.New("not used")
}
func (b *endedBackend) Stop(context.Context, string, time.Duration) error { return nil }
func (b *endedBackend) Destroy(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.destroys++
	if b.destroys <= b.failFirst {
		return errors.New("remove cgroup: device or resource busy")
	}
	close(b.destroyed)
	return nil
}
func (b *endedBackend) Recover(context.Context) ([]runtime.Recovered, error) {
	return []runtime.Recovered{{Spec: runtime.Spec{ID: "ended-1"},
		Exit: &runtime.Exit{Reason: "Vanished", Message: "the container is gone", At: time.Now()}}}, nil
}

// TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors: a sandbox a crash left
// half-made is destroyed by the restarted runner, and a teardown that fails for a
// moment is tried again rather than leaving the sandbox's mounts and files behind.
func TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors(t *testing.T) {
	be := &endedBackend{failFirst: 2, destroyed: make(chan struct{})}
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	select {
	case <-be.destroyed:
	case <-time.After(10 * time.Second):
		t.Fatalf("not destroyed after %d attempts", be.destroys)
	}
	sb, err := r.WaitTerminal(context.Background(), "ended-1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != StateFailed || sb.Reason != "Vanished" {
		t.Errorf("recovered sandbox: %s %s, want FAILED Vanished", sb.State, sb.Reason)
	}
	if be.destroys != 3 {
		t.Errorf("destroys = %d, want 3 (two failures, then success)", be.destroys)
	}
}

// TestKeepRegularFiles: what a sandbox planted in its log dir — a symlink to a host file,
// a FIFO, a symlinked dir — is gone from the archive; the logs stay.
func TestKeepRegularFiles(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "main.log"), []byte("log"), 0o600))
	must(os.Mkdir(filepath.Join(dir, "sub"), 0o700))
	must(os.WriteFile(filepath.Join(dir, "sub", "main.idx"), []byte("idx"), 0o600))
	must(os.Symlink("/etc/shadow", filepath.Join(dir, "shadow.log")))
	must(os.Symlink("/etc", filepath.Join(dir, "etc")))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	if n := keepRegularFiles(dir); n != 3 {
		t.Errorf("removed %d entries, want 3", n)
	}
	var left []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(dir, p)
		left = append(left, rel)
		return nil
	})
	if strings.Join(left, " ") != ". main.log sub sub/main.idx" {
		t.Errorf("left: %v", left)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("a symlink's target was touched: %v", err)
	}
}

// TestCopyRegularTree: logs on another filesystem are copied, without what the sandbox
// planted beside them.
func TestCopyRegularTree(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "archive")
	if err := os.MkdirAll(filepath.Join(src, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "logs", "main.log"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "logs", "main.idx")); err != nil {
		t.Fatal(err)
	}
	if err := copyRegularTree(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "logs", "main.log")); err != nil || string(b) != "hello" {
		t.Errorf("copied log: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "logs", "main.idx")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the symlink was copied (or followed): %v", err)
	}
}
