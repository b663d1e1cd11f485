package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// A standby agent serves but runs nothing, reports STANDBY (never a RUNNING-ish state),
// refuses calls that need the main command's config, and runs the config Start gives it
// exactly as a config file's.
func TestStandbyStart(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Standby: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := h.client.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil || st.Msg.State != agentv1.MainState_MAIN_STATE_STANDBY {
		t.Fatalf("standby status %v, %v", st, err)
	}
	if _, err := h.client.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("exec in standby: %v", err)
	}
	if _, err := h.client.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: []byte(`{"argv":[]}`)})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("start without argv: %v", err)
	}
	watch, err := h.client.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !watch.Receive() || watch.Msg().State != agentv1.MainState_MAIN_STATE_STANDBY {
		t.Fatalf("first watched status %v (%v)", watch.Msg(), watch.Err())
	}

	work := t.TempDir()
	file := filepath.Join(work, "f.txt")
	cfg, _ := json.Marshal(agentconfig.Config{
		Argv: []string{"sh", "-c", `echo "$GREETING"; cat f.txt; exit 3`}, Env: []string{"PATH=/usr/bin:/bin", "GREETING=hi"},
		WorkingDir: work, Files: []agentconfig.File{{Path: file, Content: []byte("content\n")}},
	})
	if _, err := h.client.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: cfg})); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: cfg})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("second start: %v", err)
	}
	var states []string
	for watch.Receive() {
		states = append(states, watch.Msg().State.String())
	}
	// Watch may skip intermediate states; it ends with the final one.
	if got := strings.Join(states, " "); !strings.HasSuffix(got, "MAIN_STATE_FAILED") || strings.Contains(got, "STANDBY") {
		t.Errorf("states after start: %s", got)
	}
	if code := h.wait(t); code != 3 {
		t.Errorf("exit code %d", code)
	}
	if got := h.logText(t); got != "hi\ncontent\n" {
		t.Errorf("log %q", got)
	}
}

// Stopped before Start: STOPPED, exit 0, nothing ran.
func TestStandbyStop(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Standby: true})
	time.Sleep(50 * time.Millisecond)
	h.stop()
	if code := h.wait(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if st := h.statusFile(t); st.State != agentv1.MainState_MAIN_STATE_STOPPED || st.ExitCode != nil {
		t.Errorf("status %v", st)
	}
	if _, err := os.Stat(filepath.Join(h.stateDir, agentconfig.StatusFile)); err != nil {
		t.Error(err)
	}
}

// A standby config's Env and WorkingDir complete the Start config (the Kubernetes
// backend's held containers: the image's environment is known only in the container):
// Start's Env overrides the base, and an empty Start WorkingDir takes the base's.
func TestStandbyBaseEnv(t *testing.T) {
	work := t.TempDir()
	h := startAgent(t, &agentconfig.Config{Standby: true, Env: []string{"PATH=/usr/bin:/bin", "IMAGE=img", "GREETING=base"}, WorkingDir: work})
	ctx := context.Background()
	cfg, _ := json.Marshal(agentconfig.Config{Argv: []string{"sh", "-c", `echo "$IMAGE $GREETING $(pwd)"`}, Env: []string{"GREETING=spec"}})
	if _, err := h.client.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: cfg})); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if got, want := h.logText(t), "img spec "+work+"\n"; got != want {
		t.Errorf("log %q, want %q", got, want)
	}
}

// A Start config with HoldExit: the agent reports the main command's end as always (the
// Watch stream ends with the final status, status.json has it, serving stops), but Run
// returns only once released; a stop request does not release it either.
func TestHoldExit(t *testing.T) {
	release := make(chan struct{})
	h := startAgent(t, &agentconfig.Config{Standby: true}, func(o *Options) { o.Release = release })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, _ := json.Marshal(agentconfig.Config{Argv: []string{"sh", "-c", "exit 3"}, Env: []string{"PATH=/usr/bin:/bin"}, HoldExit: true})
	watch, err := h.client.Watch(ctx, connect.NewRequest(&agentv1.WatchRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: cfg})); err != nil {
		t.Fatal(err)
	}
	var last *agentv1.StatusResponse
	for watch.Receive() {
		last = watch.Msg()
	}
	if last.GetState() != agentv1.MainState_MAIN_STATE_FAILED || last.GetExitCode() != 3 {
		t.Fatalf("last watched status %v (%v), want failed with 3", last, watch.Err())
	}
	if st := h.statusFile(t); st.State != agentv1.MainState_MAIN_STATE_FAILED || st.GetExitCode() != 3 {
		t.Errorf("status file %v", st)
	}
	// It stops serving (the listener is closed) but holds.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := h.client.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held agent still serves")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.stop()
	select {
	case code := <-h.result:
		t.Fatalf("the agent exited (%d) before it was released", code)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if code := h.wait(t); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
}
