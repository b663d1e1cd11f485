package local

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
)

// TestWaitAgentExitAfterAgentRan: a gVisor sandbox that has ended before a dial got
// through is an exit once its agent ran — it opened its main log, also while STARTING,
// when it writes no status.json — and a start error when it never did.
func TestWaitAgentExitAfterAgentRan(t *testing.T) {
	exited := func(t *testing.T) *proc {
		cmd := exec.Command("true")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p, err := openProc(cmd.Process.Pid, 0) // a zombie until Wait: still there
		if err != nil || p == nil {
			t.Fatalf("openProc: %v, %v", p, err)
		}
		t.Cleanup(func() { p.f.Close() })
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b := &Backend{}

	t.Run("agent killed while STARTING", func(t *testing.T) {
		dir := t.TempDir()
		w, err := logstore.Open(filepath.Join(dir, dirRun, agentconfig.LogsDir), agentconfig.MainLog)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if _, err := os.Lstat(filepath.Join(dir, dirRun, agentconfig.StatusFile)); err == nil {
			t.Fatal("status.json made by the test")
		}
		if err := b.waitAgent(context.Background(), &sandbox{id: "wa-ran", dir: dir, proc: exited(t)}); err != nil {
			t.Errorf("waitAgent = %v, want nil (an exit for the watcher)", err)
		}
	})
	t.Run("agent never ran", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, dirRun), 0o755); err != nil {
			t.Fatal(err)
		}
		err := b.waitAgent(context.Background(), &sandbox{id: "wa-never", dir: dir, proc: exited(t)})
		if err == nil || !strings.Contains(err.Error(), "exited before its agent listened") {
			t.Errorf("waitAgent = %v, want a start error", err)
		}
	})
}
