package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestEndedSandboxesOutliveTheRunner: a restarted runner knows the sandboxes that ended
// within the retention window, as they ended, with their logs; it deletes the records
// and logs whose window has passed, and logs no record accounts for.
func TestEndedSandboxesOutliveTheRunner(t *testing.T) {
	dir := t.TempDir()
	be := runtimetest.NewFake()
	be.OnCreate = failCreate(fmt.Errorf("pull x: %w", runtime.ErrImageNotFound))
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.WaitTerminal(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	// A log as the runner archives it, an expired record with its log, and a stray log.
	for _, id := range []string{sb.ID, "expired", "stray"} {
		if err := os.MkdirAll(filepath.Join(dir, "logs", id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	expired := first
	expired.ID, expired.EndedAt = "expired", time.Now().Add(-2*time.Hour)
	if err := r.recordEnded(expired); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r2, err := New(context.Background(), Config{Backend: runtimetest.NewFake(), DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	again, err := r2.Get(sb.ID)
	if err != nil || again.State != StateFailed || again.Reason != ReasonImagePullFailed || again.Message != first.Message || !again.EndedAt.Equal(first.EndedAt) {
		t.Errorf("after a restart: %+v, %v; want %s %s %q", again, err, first.State, first.Reason, first.Message)
	}
	if _, err := r2.Get("expired"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a sandbox past its retention window: %v, want not found", err)
	}
	for id, want := range map[string]bool{sb.ID: true, "expired": false, "stray": false} {
		if _, err := os.Stat(filepath.Join(dir, "logs", id)); (err == nil) != want {
			t.Errorf("logs of %s kept: %v, want %v", id, err == nil, want)
		}
	}
	if _, err := os.Stat(r2.endedPath("expired")); !os.IsNotExist(err) {
		t.Errorf("record of an expired sandbox: %v", err)
	}
}

// logDirBackend is a Fake whose sandboxes keep their logs in dir.
type logDirBackend struct {
	*runtimetest.Fake
	dir string
}

var _ runtime.LogDirProvider = (*logDirBackend)(nil)

func (b *logDirBackend) LogDir(_, container string) string {
	if container != "" {
		return ""
	}
	return b.dir
}

// TestArchiveSkipsAReplacedLogDir: a sandbox can write the dir above its log dir, so it
// can replace the log dir with a symlink to another sandbox's logs before it ends. The
// runner archives only a real directory: the ended sandbox's log is empty, never the
// other one's.
func TestArchiveSkipsAReplacedLogDir(t *testing.T) {
	victim := t.TempDir()
	w, err := logstore.Open(victim, "main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(logstore.Combined, []byte("victim secret\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	swapped := filepath.Join(t.TempDir(), "logs")
	if err := os.Symlink(victim, swapped); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	be := &logDirBackend{Fake: runtimetest.NewFake(), dir: swapped}
	be.OnCreate = exitsAtOnce
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.WaitTerminal(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = r.Logs(ctx, sb.ID, "", &agentv1.LogsRequest{}, func(m *agentv1.LogsResponse) error { got = append(got, m.GetData()...); return nil })
	if err != nil || len(got) > 0 {
		t.Errorf("log of the sandbox that swapped its log dir: %q %v, want empty", got, err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "logs", sb.ID)); err == nil {
		t.Errorf("archived %s", fi.Mode().Type())
	}
}

// TestEndedSandboxKeepsNoFileContents: a spec's files (up to 64 MiB) went into the
// sandbox at create; an ended sandbox keeps their paths, not their contents, in memory
// for the retention window and in its record on disk.
func TestEndedSandboxKeepsNoFileContents(t *testing.T) {
	dir := t.TempDir()
	be := runtimetest.NewFake()
	be.OnCreate = exitsAtOnce
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	content := make([]byte, 8<<20)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Files: []runtime.File{{Path: "/data/big", Content: content, Mode: 0o600}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end, err := r.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f := end.Spec.Files; len(f) != 1 || f[0].Path != "/data/big" || f[0].Mode != 0o600 || f[0].Content != nil {
		t.Errorf("files of the ended sandbox: %d, want /data/big 0600 without content", len(f))
	}
	fi, err := os.Stat(r.endedPath(sb.ID))
	if err != nil {
		t.Fatalf("record of the ended sandbox: %v", err)
	}
	if fi.Size() > 64<<10 {
		t.Errorf("record of the ended sandbox: %d bytes, want at most 64 KiB", fi.Size())
	}
}
