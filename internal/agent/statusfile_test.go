package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// TestStatusFileFromRunning: a new agent writes no status.json for its STARTING (its
// main command's RUNNING follows at once; no file says what STARTING would to the
// file's readers), then every state as always: RUNNING with its pid, the final one.
func TestStatusFileFromRunning(t *testing.T) {
	var stateDir atomic.Pointer[string]
	seen := make(chan error, 1)
	before := func() {
		_, err := os.Stat(filepath.Join(*stateDir.Load(), agentconfig.StatusFile))
		seen <- err
	}
	testBeforeFiles.Store(&before)
	defer testBeforeFiles.Store(nil)
	h := startAgent(t, longMain(), func(o *Options) { stateDir.Store(&o.StateDir) })
	if err := <-seen; !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("status.json while STARTING: %v, want none", err)
	}
	pid := waitRunning(t, h)
	if st := h.statusFile(t); st.State != agentv1.MainState_MAIN_STATE_RUNNING || st.Pid != pid {
		t.Errorf("status.json while running = %v, want RUNNING pid %d", st, pid)
	}
	h.stop()
	h.wait(t)
	if st := h.statusFile(t); st.State != agentv1.MainState_MAIN_STATE_STOPPED {
		t.Errorf("final status.json %v", st)
	}
}

// TestStaleStatusFileRemoved: a status.json an earlier agent left in the state dir (a
// Pod's restarted container keeps its run dir) is gone once the new agent runs, so no
// reader takes the earlier run's final state for this one's.
func TestStaleStatusFileRemoved(t *testing.T) {
	stale := []byte(`{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed"}`)
	var stateDir atomic.Pointer[string]
	seen := make(chan error, 1)
	// Checked before the main command starts: RUNNING's write would replace the file
	// whether or not the stale one was removed.
	before := func() {
		_, err := os.Stat(filepath.Join(*stateDir.Load(), agentconfig.StatusFile))
		seen <- err
	}
	testBeforeFiles.Store(&before)
	defer testBeforeFiles.Store(nil)
	h := startAgent(t, longMain(), func(o *Options) {
		stateDir.Store(&o.StateDir)
		if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(o.StateDir, agentconfig.StatusFile), stale, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if err := <-seen; !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an earlier agent's status.json while STARTING: %v, want none", err)
	}
	waitRunning(t, h)
	if st, err := ReadStatusFile(h.stateDir); err != nil || st.State != agentv1.MainState_MAIN_STATE_RUNNING {
		t.Errorf("status.json while running = %v, %v; want RUNNING", st, err)
	}
}
