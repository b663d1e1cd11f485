package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// streamLogs collects a StreamLogs call: the entries, their data, and the call's error.
// It checks that offsets grow by exactly the bytes of each entry (timestamps off).
func streamLogs(t *testing.T, c interface {
	StreamLogs(context.Context, *connect.Request[sandboxv1.StreamLogsRequest]) (*connect.ServerStreamForClient[sandboxv1.LogEntry], error)
}, req *sandboxv1.StreamLogsRequest) ([]*sandboxv1.LogEntry, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := c.StreamLogs(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, "", err
	}
	var entries []*sandboxv1.LogEntry
	var all bytes.Buffer
	next := req.GetResumeLogOffset()
	for s.Receive() {
		e := s.Msg()
		entries = append(entries, e)
		all.Write(e.GetData())
		if e.GetError() != nil {
			continue
		}
		if !req.GetTimestamps() && req.GetTailLines() == 0 && req.GetSinceTime() == nil && e.GetNextLogOffset() != next+uint64(len(e.GetData())) {
			t.Errorf("entry of %d bytes ends at %d, the previous at %d", len(e.GetData()), e.GetNextLogOffset(), next)
		}
		next = e.GetNextLogOffset()
	}
	return entries, all.String(), s.Err()
}

func streamErrors(entries []*sandboxv1.LogEntry) []string {
	var out []string
	for _, e := range entries {
		if e.GetError() != nil {
			out = append(out, e.GetError().GetCode()+": "+e.GetError().GetMessage())
		}
	}
	return out
}

// checkStoredLogs reads the log of an ended sandbox every way a client can and compares
// it with want.
func checkStoredLogs(t *testing.T, g *gw, id, want string) {
	t.Helper()
	entries, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id})
	if err != nil || got != want || len(streamErrors(entries)) > 0 {
		t.Fatalf("logs of ended sandbox %s: %q %v %v, want %q", id, got, err, streamErrors(entries), want)
	}
	session := entries[0].GetLogSessionId()
	if _, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id, Follow: true}); err != nil || got != want {
		t.Errorf("follow on ended sandbox %s: %q %v, want %q and an end", id, got, err, want)
	}
	lines := strings.SplitAfter(want, "\n")
	last := lines[len(lines)-2]
	if _, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id, TailLines: 1}); err != nil || got != last {
		t.Errorf("tail 1 of %s: %q %v, want %q", id, got, err, last)
	}
	if _, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id, TailLines: 1, Timestamps: true}); err != nil ||
		!strings.HasSuffix(got, "Z "+last) || !strings.HasPrefix(got, "20") {
		t.Errorf("tail 1 with timestamps of %s: %q %v", id, got, err)
	}
	if n := len(entries); n > 1 {
		since := entries[n-1].GetTimestamp()
		if _, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id, SinceTime: since}); err != nil || !strings.HasSuffix(want, got) || got == "" || got == want {
			t.Errorf("since the last entry's time of %s: %q %v", id, got, err)
		}
	}
	if _, got, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: id, Follow: true, ResumeLogSessionId: session, ResumeLogOffset: 2}); err != nil || got != want[2:] {
		t.Errorf("resume at offset 2 of %s: %q %v, want %q", id, got, err, want[2:])
	}
}

// TestLogsOutliveTheSandbox: the log of a COMPLETED, FAILED or TERMINATED sandbox stays
// readable through the gateway (all, tail, since, timestamps, follow that ends, resume),
// and a follow that is open when the sandbox ends gets everything and then ends cleanly.
func TestLogsOutliveTheSandbox(t *testing.T) {
	g := startGateway(t)
	completed := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo one; echo two >&2; sleep 0.2; echo three`), "")
	failed := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo boom >&2; exit 3`), "")
	deleted := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo alive; trap "echo bye; exit 0" TERM; sleep infinity & wait`), "")
	followed := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo first; trap "echo last; exit 0" TERM; sleep infinity & wait`), "")

	// A follow open across the end of its sandbox (deleted): all of it, then a clean end.
	g.waitState(t, followed.SandboxId, sandboxv1.State_STATE_RUNNING)
	type result struct {
		entries []*sandboxv1.LogEntry
		data    string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		e, d, err := streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: followed.SandboxId, Follow: true})
		done <- result{e, d, err}
	}()
	time.Sleep(500 * time.Millisecond)
	if _, err := g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: followed.SandboxId, GracePeriodSeconds: 5})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.data != "first\nlast\n" || len(streamErrors(r.entries)) > 0 {
			t.Errorf("follow across the end: %q %v %v, want first, last and a clean end", r.data, r.err, streamErrors(r.entries))
		}
	case <-time.After(30 * time.Second):
		t.Error("follow did not end with the sandbox")
	}

	g.waitState(t, completed.SandboxId, sandboxv1.State_STATE_COMPLETED)
	checkStoredLogs(t, g, completed.SandboxId, "one\ntwo\nthree\n")

	g.waitState(t, deleted.SandboxId, sandboxv1.State_STATE_RUNNING)
	if _, err := g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: deleted.SandboxId, GracePeriodSeconds: 5})); err != nil {
		t.Fatal(err)
	}
	g.waitState(t, deleted.SandboxId, sandboxv1.State_STATE_TERMINATED)
	checkStoredLogs(t, g, deleted.SandboxId, "alive\nbye\n")

	g.waitState(t, failed.SandboxId, sandboxv1.State_STATE_FAILED)
	checkStoredLogs(t, g, failed.SandboxId, strings.Repeat("boom\n", 7)) // the first run and 6 restarts
}

// TestLogsOutliveTheRunner: an ended sandbox's log survives a runner restart within the
// retention window, and is deleted once the window has passed, by the restarted runner
// too.
func TestLogsOutliveTheRunner(t *testing.T) {
	dir := t.TempDir()
	cfg := env.StackConfig(dir)
	cfg.Retention = 6 * time.Second
	open := func() *stack.Stack {
		s, err := stack.NewLocal(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := open()
	g := startGatewayOn(t, first)
	sb := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo kept; echo also >&2`), "")
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_COMPLETED)
	ended := time.Now()
	archive := filepath.Join(dir, "runner", "logs", sb.SandboxId)
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("no archive of the ended sandbox's log: %v", err)
	}
	first.Close()

	second := open()
	t.Cleanup(func() { finish(t, second, dir) })
	t.Cleanup(second.Close)
	if sb2, err := second.Runner.Get(sb.SandboxId); err != nil || sb2.State.String() != "COMPLETED" || sb2.ExitCode == nil || *sb2.ExitCode != 0 {
		t.Errorf("after a runner restart the ended sandbox is %+v, %v; want COMPLETED, exit 0", sb2, err)
	}
	// (A gateway's index in memory forgets on restart: ask the runner, as a gateway would.)
	var out bytes.Buffer
	err := second.Runner.Logs(context.Background(), sb.SandboxId, "", &agentv1.LogsRequest{}, func(m *agentv1.LogsResponse) error { out.Write(m.GetData()); return nil })
	if err != nil || out.String() != "kept\nalso\n" {
		t.Errorf("log after a runner restart: %q %v", out.String(), err)
	}

	time.Sleep(time.Until(ended.Add(cfg.Retention + 2*time.Second)))
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Errorf("archive still there after the retention window: %v", err)
	}
	if _, err := second.Runner.Get(sb.SandboxId); err == nil {
		t.Error("the runner still knows the sandbox after the retention window")
	}
}

// TestLogsOfEndedSandboxDirectAndSbx: the direct data plane (certificates for logs only)
// and `sbx logs` read an ended sandbox's log too.
func TestLogsOfEndedSandboxDirectAndSbx(t *testing.T) {
	g, dp := startGatewayWithDataPlane(t)
	sb := g.create(t, spec(busybox(), "/bin/sh", "-c", `echo out; echo err >&2; exit 0`), "")
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_COMPLETED)

	ctx := context.Background()
	c, err := sandbox.New(g.url, g.keyA, sandbox.WithDataPlane(sandbox.DataPlaneDirect))
	if err != nil {
		t.Fatal(err)
	}
	before := dp.Server.Calls()
	var out bytes.Buffer
	if err := c.Sandbox(sb.SandboxId).Logs(ctx, sandbox.LogOptions{}, &out); err != nil || out.String() != "out\nerr\n" || dp.Server.Calls() == before {
		t.Errorf("direct logs of an ended sandbox: %q %v (%d direct calls)", out.String(), err, dp.Server.Calls()-before)
	}
	// A certificate for anything but logs is still refused for an ended sandbox.
	if _, err := c.Sandbox(sb.SandboxId).ReadFile(ctx, "/etc/hostname"); err == nil {
		t.Error("read a file of an ended sandbox directly")
	}

	for _, args := range [][]string{{"logs", sb.SandboxId}, {"logs", "-f", sb.SandboxId}, {"--data-plane", "gateway", "logs", sb.SandboxId}} {
		if out, errs, code := sbx(g, "", args...); code != 0 || out != "out\nerr\n" {
			t.Errorf("sbx %v: %q %q %d", args, out, errs, code)
		}
	}
	// The reason the client maps when a sandbox is unknown stays NOT_FOUND.
	_, _, err = streamLogs(t, g.sandboxes, &sandboxv1.StreamLogsRequest{SandboxId: "nosuchsandbox"})
	if apierr.Reason(err) != apierr.SandboxNotFound {
		t.Errorf("logs of an unknown sandbox: %v", err)
	}
}

// TestLogsOfASandboxThatSwappedItsLogDir: root in a sandbox can write the dir above its
// log dir (/.sandboxd/run). One that replaces its log dir with a symlink to another
// sandbox's log dir on the host and ends must get its own (empty) log back, never the
// other sandbox's: the runner archives only a real directory. (Without a disk limit, as
// here, the log dir is renamed into the archive, symlink and all; with one it is copied,
// which never followed a symlink.)
func TestLogsOfASandboxThatSwappedItsLogDir(t *testing.T) {
	s := startedStack(t)
	victim := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `echo victim-secret; trap "exit 0" TERM; sleep infinity & wait`}}}})
	waitState(t, s, victim.ID, runner.StateRunning, time.Minute)
	victimLogs := s.Backend.LogDir(victim.ID, "")
	swap := `cd /.sandboxd/run && mv logs mine && ln -s "$1" logs && echo swapped`
	attacker := create(t, s, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox(), Command: "/bin/sh", Args: []string{"-c", swap, "sh", victimLogs}}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	end, err := s.Runner.WaitTerminal(ctx, attacker.ID)
	if err != nil || end.State != runner.StateCompleted {
		t.Fatalf("attacker ended %+v, %v; want COMPLETED", end, err)
	}
	read := func(id string) string {
		var out bytes.Buffer
		if err := s.Runner.Logs(ctx, id, "", &agentv1.LogsRequest{}, func(m *agentv1.LogsResponse) error { out.Write(m.GetData()); return nil }); err != nil {
			t.Errorf("logs of %s: %v", id, err)
		}
		return out.String()
	}
	if got := read(attacker.ID); strings.Contains(got, "victim-secret") {
		t.Errorf("the attacker's log is the victim's: %q", got)
	}
	if got := read(victim.ID); got != "victim-secret\n" {
		t.Errorf("the victim's log: %q", got)
	}
}
