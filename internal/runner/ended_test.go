package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// scriptBackend ends every sandbox as told: Create fails with createErr, or Wait returns
// exit and waitErr (after Stop when block is set). Its agents cannot be reached.
type scriptBackend struct {
	createErr error
	exit      runtime.Exit
	waitErr   error
	block     bool

	mu      sync.Mutex
	stopped map[string]chan struct{}
}

func (b *scriptBackend) stopCh(id string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		b.stopped = map[string]chan struct{}{}
	}
	if b.stopped[id] == nil {
		b.stopped[id] = make(chan struct{})
	}
	return b.stopped[id]
}

func (b *scriptBackend) Create(_ context.Context, spec *runtime.Spec) (runtime.Info, error) {
	if b.createErr != nil {
		return runtime.Info{}, b.createErr
	}
	return runtime.Info{ID: spec.ID, StartedAt: time.Now()}, nil
}
func (b *scriptBackend) DialAgent(context.Context, string) (net.Conn, error) {
	return nil, errors.New("no agent here")
}
func (b *scriptBackend) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	if b.block {
		select {
		case <-b.stopCh(id):
		case <-ctx.Done():
			return runtime.Exit{}, ctx.Err()
		}
	}
	return b.exit, b.waitErr
}
func (b *scriptBackend) Stop(_ context.Context, id string, _ time.Duration) error {
	ch := b.stopCh(id)
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
	return nil
}
func (b *scriptBackend) Destroy(context.Context, string) error                { return nil }
func (b *scriptBackend) Recover(context.Context) ([]runtime.Recovered, error) { return nil, nil }

func code(c int32) *int32 { return &c }

// TestEveryEndHasAReason: each way a sandbox can end gives its state and a reason (the
// wire's state_reason), and a sandbox stopped at its lifetime has no exit code.
func TestEveryEndHasAReason(t *testing.T) {
	tests := []struct {
		name     string
		be       *scriptBackend
		lifetime time.Duration
		delete   bool
		state    State
		reason   string
		message  string // a part of the message
		exit     *int32
	}{
		{"image not found", &scriptBackend{createErr: fmt.Errorf("pull x: %w", runtime.ErrImageNotFound)}, 0, false, StateFailed, ReasonImagePullFailed, "image not found", nil},
		{"registry down", &scriptBackend{createErr: fmt.Errorf("pull x: %w", runtime.ErrRegistry)}, 0, false, StateFailed, ReasonImagePullFailed, "registry", nil},
		{"invalid spec", &scriptBackend{createErr: fmt.Errorf("%w: bad mount", runtime.ErrInvalidSpec)}, 0, false, StateFailed, ReasonStartError, "bad mount", nil},
		{"backend fails to create", &scriptBackend{createErr: errors.New("disk full")}, 0, false, StateFailed, ReasonBackendError, "disk full", nil},
		{"exit 0", &scriptBackend{exit: runtime.Exit{ExitCode: code(0), Reason: "Completed"}}, 0, false, StateCompleted, ReasonCompleted, "", code(0)},
		{"restart limit", &scriptBackend{exit: runtime.Exit{ExitCode: code(3), Reason: "RestartLimit", Message: "main command exited with code 3; restart limit 6 reached"}}, 0, false, StateFailed, ReasonRestartLimit, "code 3", code(3)},
		{"oom", &scriptBackend{exit: runtime.Exit{Reason: "OOMKilled", Message: "memory limit exceeded"}}, 0, false, StateFailed, ReasonOOMKilled, "memory", nil},
		{"start error", &scriptBackend{exit: runtime.Exit{Reason: "StartError", Message: "exec: no such file"}}, 0, false, StateFailed, ReasonStartError, "no such file", nil},
		{"vanished", &scriptBackend{exit: runtime.Exit{Reason: "Vanished", Message: "the container is gone"}}, 0, false, StateFailed, ReasonVanished, "gone", nil},
		{"no reason from the backend", &scriptBackend{exit: runtime.Exit{ExitCode: code(1)}}, 0, false, StateFailed, "Error", "", code(1)},
		{"wait fails", &scriptBackend{waitErr: errors.New("runc state: broken")}, 0, false, StateFailed, ReasonBackendError, "broken", nil},
		{"lifetime before the start", &scriptBackend{block: true, exit: runtime.Exit{ExitCode: code(143), Reason: "Stopped"}}, time.Second, false, StateFailed, ReasonLifetimeExceeded, "before the sandbox started", nil},
		{"deleted", &scriptBackend{block: true, exit: runtime.Exit{ExitCode: code(0), Reason: "Stopped"}}, 0, true, StateTerminated, ReasonDeleted, "deleted", code(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(context.Background(), Config{Backend: tc.be, DataDir: t.TempDir(), ExpiryGrace: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Image: "busybox"}, Lifetime: tc.lifetime})
			if err != nil {
				t.Fatal(err)
			}
			if tc.delete {
				if _, err := r.Delete(sb.ID, time.Second); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			end, err := r.WaitTerminal(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if end.State != tc.state || end.Reason != tc.reason || !strings.Contains(end.Message, tc.message) {
				t.Errorf("ended %s %s: %q, want %s %s: …%s…", end.State, end.Reason, end.Message, tc.state, tc.reason, tc.message)
			}
			if (end.ExitCode == nil) != (tc.exit == nil) || end.ExitCode != nil && *end.ExitCode != *tc.exit {
				t.Errorf("exit code %v, want %v", end.ExitCode, tc.exit)
			}
		})
	}
}

// TestEndedSandboxesOutliveTheRunner: a restarted runner knows the sandboxes that ended
// within the retention window, as they ended, with their logs; it deletes the records
// and logs whose window has passed, and logs no record accounts for.
func TestEndedSandboxesOutliveTheRunner(t *testing.T) {
	dir := t.TempDir()
	be := &scriptBackend{createErr: fmt.Errorf("pull x: %w", runtime.ErrImageNotFound)}
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Image: "busybox"}})
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

	r2, err := New(context.Background(), Config{Backend: &scriptBackend{}, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	again, err := r2.Get(sb.ID)
	if err != nil || again.State != StateFailed || again.Reason != ReasonImagePullFailed || again.Message != first.Message || !again.EndedAt.Equal(first.EndedAt) {
		t.Errorf("after a restart: %+v, %v; want %s %s %q", again, err, first.State, first.Reason, first.Message)
	}
	if _, err := r2.Get("expired"); !errors.Is(err, ErrNotFound) {
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

// logDirBackend is a scriptBackend whose sandboxes keep their logs in dir.
type logDirBackend struct {
	scriptBackend
	dir string
}

func (b *logDirBackend) LogDir(string) string { return b.dir }

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
	be := &logDirBackend{scriptBackend: scriptBackend{exit: runtime.Exit{ExitCode: code(0), Reason: "Completed"}}, dir: swapped}
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Image: "busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.WaitTerminal(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = r.Logs(ctx, sb.ID, &agentv1.LogsRequest{}, func(m *agentv1.LogsResponse) error { got = append(got, m.GetData()...); return nil })
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
	r, err := New(context.Background(), Config{Backend: &scriptBackend{exit: runtime.Exit{ExitCode: code(0), Reason: "Completed"}}, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	content := make([]byte, 8<<20)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Image: "busybox",
		Files: []runtime.File{{Path: "/data/big", Content: content, Mode: 0o600}}}})
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
