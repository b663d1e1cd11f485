package runner

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors: a sandbox a crash left
// half-made is destroyed by the restarted runner, and a teardown that fails for a
// moment is tried again rather than leaving the sandbox's mounts and files behind.
func TestRecoveredEndedSandboxIsDestroyedDespiteTransientErrors(t *testing.T) {
	be := runtimetest.NewFake()
	be.FailDestroys = 2 // a teardown step busy for a moment
	be.Put(runtime.Recovered{Spec: runtime.Spec{ID: "ended-1"},
		Exit: &runtime.Exit{Reason: "Vanished", Message: "the container is gone", At: time.Now()}})
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sb, err := r.WaitTerminal(ctx, "ended-1")
	if err != nil {
		t.Fatalf("not destroyed after %d attempts: %v", be.Calls().Destroy, err)
	}
	if sb.State != StateFailed || sb.Reason != "Vanished" {
		t.Errorf("recovered sandbox: %s %s, want FAILED Vanished", sb.State, sb.Reason)
	}
	if d := be.Calls().Destroy; d != 3 {
		t.Errorf("destroys = %d, want 3 (two failures, then success)", d)
	}
	if be.Sandbox("ended-1", 0) != nil {
		t.Error("the sandbox is still in the backend")
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
