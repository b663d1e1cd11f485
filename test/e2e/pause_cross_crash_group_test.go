package e2e

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
)

// sideOf reads the sidecar counter (sideCounter) of group sandbox id through the
// gateway, waiting for it.
func (x *xcrashRig) sideOf(t *testing.T, id string) sideState {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := x.g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Container: "side", Command: []string{"cat", "/tmp/side"}}))
		cancel()
		if err == nil && res.Msg.ExitCode == 0 {
			if f := strings.Fields(string(res.Msg.Stdout)); len(f) == 2 {
				if n, err := strconv.Atoi(f[1]); err == nil {
					return sideState{boot: f[0], count: n}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar's counter of %s: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPauseCrossCrashGroup: the exporting runner killed (SIGKILL at a failpoint) while
// it exports a checkpointed two-container gVisor group for a move: after the image part
// is up, and after every part is up but before the manifest. No manifest is written
// (the checkpoint is incomplete to every reader), the other runner has nothing of the
// group, the group is PAUSED on its runner with its checkpoint, the restarted runner
// sweeps the parts the killed export left, and the group resumes there with both
// containers' memory intact; then it moves to the other runner.
func TestPauseCrossCrashGroup(t *testing.T) {
	x := startXCrashRig(t)
	sp := groupCounterSpec()
	sp.Services = nil // the rig has no edges
	sp.RunnerIds = []string{"r1"}
	src := x.g.createRetrying(t, sp).SandboxId
	x.g.waitState(t, src, sandboxv1.State_STATE_RUNNING)
	t.Cleanup(func() {
		_, _ = x.g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: src}))
		deadline := time.Now().Add(60 * time.Second)
		for _, r := range []*xcrashRunner{x.r1, x.r2} {
			for len(r.live(t, src)) > 0 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if live := r.live(t, src); len(live) > 0 {
				t.Errorf("runner %s: %s still %v after its delete", r.id, src, xcrashStates(live))
			}
		}
		deadline = time.Now().Add(30 * time.Second)
		for _, r := range []*xcrashRunner{x.r1, x.r2} {
			for len(r.leftovers()) > 0 && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if left := r.leftovers(); len(left) > 0 {
				t.Errorf("runner %s: left after every sandbox was deleted: %q", r.id, left)
			}
		}
		if objs := x.checkpointObjects(t); len(objs) > 0 {
			t.Errorf("left in the bucket at the end: %q", objs)
		}
	})
	if _, err := x.exec(src, "echo v"+src[:4]+" > /tmp/v"); err != nil {
		t.Fatal(err)
	}
	cur, err := x.counter(t, src)
	if err != nil {
		t.Fatal(err)
	}
	side := x.sideOf(t, src)
	// next checks that both containers continue where they were (memory intact).
	next := func(t *testing.T, what string) {
		t.Helper()
		got, err := x.counter(t, src)
		if err != nil {
			t.Fatalf("%s: the sandbox does not answer: %v", what, err)
		}
		if got.boot != cur.boot || got.count != cur.count+1 || got.value != cur.value {
			t.Errorf("%s: server state %+v, want boot %s count %d value %s (memory intact)", what, got, cur.boot, cur.count+1, cur.value)
		}
		cur = got
		s := x.sideOf(t, src)
		if s.boot != side.boot || s.count < side.count {
			t.Errorf("%s: sidecar %+v, want token %s, count at least %d (memory intact)", what, s, side.boot, side.count)
		}
		side = s
	}
	move := func(t *testing.T) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			res, err := x.state.ResumeSandbox(ctx, connect.NewRequest(&statev1.ResumeSandboxRequest{SandboxId: src, RunnerIds: []string{"r2"}}))
			if err == nil {
				t.Errorf("the move succeeded (to %s) although a runner was killed", res.Msg.GetRunnerId())
			}
			return err
		}
	}
	for _, point := range []string{"local.export.image", "runner.export.uploaded"} {
		t.Run("move to r2, r1 killed at "+point, func(t *testing.T) {
			x.pause(t, src)
			before := x.checkpointObjects(t)
			x.r1.restart(t, point)
			err := x.r1.killedBy(t, point, move(t))
			t.Logf("move with r1 killed: %v", err)
			var parts []string
			for _, k := range x.checkpointObjects(t) {
				if !slices.Contains(before, k) {
					parts = append(parts, k)
				}
			}
			if len(parts) == 0 {
				t.Errorf("nothing of the export in the bucket when r1 died (the test's premise)")
			}
			t.Logf("left in the bucket by the killed export: %q", parts)
			x.noManifests(t, point)
			if live := x.r2.live(t, src); len(live) > 0 {
				t.Errorf("r2 has %s (%v) although the export never finished", src, xcrashStates(live))
			}
			x.r1.start(t, "")
			x.wantOn(t, "r1 restarted", src, "r1", sandboxv1.State_STATE_PAUSED)
			deadline := time.Now().Add(30 * time.Second)
			for len(x.checkpointObjects(t)) > len(before) && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			if objs := x.checkpointObjects(t); len(objs) > len(before) {
				t.Errorf("left in the bucket after r1 restarted: %q (before the move: %q)", objs, before)
			}
			res, err := x.resume(t, src)
			if err != nil {
				t.Fatalf("group PAUSED without a usable checkpoint: resume: %v", err)
			}
			if res.GetRunnerId() != "r1" || res.GetMovedFrom() != "" {
				t.Errorf("plain resume: on %q moved from %q, want on r1", res.GetRunnerId(), res.GetMovedFrom())
			}
			x.wantOn(t, "resumed", src, "r1", sandboxv1.State_STATE_RUNNING)
			next(t, "resumed on r1")
		})
	}
	t.Run("then it moves", func(t *testing.T) {
		x.pause(t, src)
		res, err := x.resume(t, src, "r2")
		if err != nil {
			t.Fatalf("move to r2: %v", err)
		}
		if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" {
			t.Errorf("move: on %q moved from %q, want on r2 from r1", res.GetRunnerId(), res.GetMovedFrom())
		}
		x.wantOn(t, "moved", src, "r2", sandboxv1.State_STATE_RUNNING)
		next(t, "moved to r2")
		x.noManifests(t, "after the move")
	})
}
