package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestAttackForgedStatusFile: status.json is in the sandbox's run dir, which its workload
// can write. Whatever it says, the exit the host records is held to what the sandbox's
// agent could say: no platform reason (OOMKilled, Evicted, Vanished...), restarts within
// the container's limit, a bounded printable message, an end time within its run.
func TestAttackForgedStatusFile(t *testing.T) {
	started := time.Now().Add(-time.Minute).UTC()
	cases := []struct {
		name, status     string
		wantReason       string
		wantRestarts     int
		wantMessageEmpty bool
		wantNow          bool // the end time is the host's, not the file's
	}{
		{"platform reason", `{"state":"MAIN_STATE_FAILED","exitCode":1,"reason":"OOMKilled","message":"memory limit exceeded"}`, agent.ReasonError, 0, false, true},
		{"evicted", `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Evicted"}`, agent.ReasonError, 0, false, true},
		{"restarts past the limit", `{"state":"MAIN_STATE_FAILED","exitCode":3,"reason":"RestartLimit","restartCount":2147483647}`, agent.ReasonRestartLimit, 2, false, true},
		{"negative restarts", `{"state":"MAIN_STATE_FAILED","exitCode":3,"reason":"Error","restartCount":-5}`, agent.ReasonError, 0, false, true},
		{"huge message", `{"state":"MAIN_STATE_FAILED","exitCode":1,"reason":"Error","message":"` + strings.Repeat("A", 500_000) + `"}`, agent.ReasonError, 0, false, true},
		{"control characters", `{"state":"MAIN_STATE_FAILED","exitCode":1,"reason":"Error","message":"ok\u001b[2Jgone"}`, agent.ReasonError, 0, true, true},
		{"end in the future", `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"2099-01-01T00:00:00Z"}`, agent.ReasonCompleted, 0, false, true},
		{"end before the start", `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed","finishedAt":"2001-01-01T00:00:00Z"}`, agent.ReasonCompleted, 0, false, true},
		{"still running", `{"state":"MAIN_STATE_RUNNING","reason":"OOMKilled","restartCount":99}`, "Killed", 2, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, dirRun), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, dirRun, "status.json"), []byte(tc.status), 0o644); err != nil {
				t.Fatal(err)
			}
			b := &Backend{cfg: Config{CgroupParent: "sandboxd-test-none"}}
			s := &sandbox{id: "sbx-forged", cid: "sbx-forged", dir: dir,
				spec: runtime.Spec{Container: runtime.Container{RestartLimit: 2}}, info: persistedInfo{StartedAt: started}}
			before := time.Now()
			ex := b.computeExit(s, "Killed")
			if ex.Reason != tc.wantReason {
				t.Errorf("reason %q, want %q", ex.Reason, tc.wantReason)
			}
			if ex.Restarts != tc.wantRestarts {
				t.Errorf("restarts %d, want %d", ex.Restarts, tc.wantRestarts)
			}
			if len(ex.Message) > agent.MaxStatusText {
				t.Errorf("message of %d bytes", len(ex.Message))
			}
			if strings.ContainsRune(ex.Message, 0x1b) || tc.wantMessageEmpty && strings.Contains(ex.Message, "gone") {
				t.Errorf("message %q", ex.Message)
			}
			if tc.wantNow && (ex.At.Before(before.Add(-time.Second)) || ex.At.After(time.Now().Add(time.Second))) {
				t.Errorf("end time %v, want the host's (about %v)", ex.At, before)
			}
		})
	}
}
