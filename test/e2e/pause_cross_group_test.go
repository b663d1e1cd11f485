package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
)

// Moves and cross-runner forks of multi-container gVisor sandboxes (a group: one
// sentry, several containers), as pause_cross_test.go does for single containers.

// sideCounter is a Python sidecar with state in memory: a token drawn at start and a
// counter it bumps every 100 ms, written (atomically) to /tmp/side as "<token> <n>".
const sideCounter = `import os, random, time
boot = "%016x" % random.getrandbits(64)
n = 0
while True:
    n += 1
    with open("/tmp/side.t", "w") as f:
        f.write("%s %d" % (boot, n))
    os.rename("/tmp/side.t", "/tmp/side")
    time.sleep(0.1)
`

// groupCounterSpec is counterSpec (the primary, "main": the counter server with its
// endpoint) with a sidecar "side" running sideCounter, and a scratch volume both mount
// at /shared.
func groupCounterSpec() *sandboxv1.SandboxSpec {
	sp := counterSpec()
	sp.Containers[0].Resources = &sandboxv1.Resources{Cpu: "1", Memory: "256Mi"}
	sp.Containers = append(sp.Containers, &sandboxv1.Container{Name: "side", Image: python(), Command: "python3", Args: []string{"-c", sideCounter},
		Resources: &sandboxv1.Resources{Cpu: "500m", Memory: "128Mi"}})
	sp.Volumes = []*sandboxv1.SandboxVolume{{Name: "shared", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: "64Mi"}}}}
	for _, c := range sp.Containers {
		c.VolumeMounts = []*sandboxv1.VolumeMount{{Volume: "shared", MountPath: "/shared"}}
	}
	return sp
}

// srcAddrPy prints the address the sandbox's packets leave from (a UDP connect sends
// nothing).
const srcAddrPy = `'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0])'`

// sideState is one reading of sideCounter.
type sideState struct {
	boot  string
	count int
}

// side reads the sidecar's counter of sandbox id (through the gateway's exec).
func (c *crossEnv) side(t *testing.T, id string) sideState {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c.g.sandboxes.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Container: "side", Command: []string{"cat", "/tmp/side"}}))
		if err == nil && res.Msg.ExitCode == 0 {
			f := strings.Fields(string(res.Msg.Stdout))
			if len(f) == 2 {
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

// shIn runs script in container of sandbox id (through the gateway) and returns its
// output.
func (c *crossEnv) shIn(t *testing.T, id, container, script string) string {
	t.Helper()
	res, err := c.g.sandboxes.Exec(context.Background(), connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Container: container, Command: []string{"sh", "-c", script}}))
	if err != nil {
		t.Fatalf("exec in %s/%s %q: %v", id, container, script, err)
	}
	if res.Msg.ExitCode != 0 {
		t.Fatalf("exec in %s/%s %q: exit %d: %s%s", id, container, script, res.Msg.ExitCode, res.Msg.Stdout, res.Msg.Stderr)
	}
	return string(res.Msg.Stdout)
}

// groupOn creates a group counter sandbox pinned to runner r and waits for its server
// and its sidecar; it is deleted when the (sub)test ends.
func (c *crossEnv) groupOn(t *testing.T, r string) (string, counterState, sideState) {
	t.Helper()
	sp := groupCounterSpec()
	sp.RunnerIds = []string{r}
	sb := c.g.create(t, sp, "")
	t.Cleanup(func() { c.del(t, sb.SandboxId) })
	if got := sb.GetStatus().GetRunnerId(); got != r {
		t.Fatalf("group sandbox pinned to %s placed on %q", r, got)
	}
	c.g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	return sb.SandboxId, c.counter(t, sb.SandboxId, r), c.side(t, sb.SandboxId)
}

// sideContinues checks that the sidecar of id continues from before (the same process:
// its token; its counter on from where it was, by no more than the time since).
func sideContinues(t *testing.T, what string, got, before sideState, since time.Time) {
	t.Helper()
	most := before.count + int(time.Since(since)/(100*time.Millisecond)) + 20
	if got.boot != before.boot || got.count < before.count || got.count > most {
		t.Errorf("%s: sidecar %+v, want token %s and a count from %d to %d (its memory continued)", what, got, before.boot, before.count, most)
	}
}

// TestPauseCrossGroup: a two-container gVisor sandbox (a Python server with its
// endpoint, a Python sidecar counting in memory, a shared scratch volume) paused with
// release_resources moves to the other runner when asked to (runner_ids) and when its
// own runner is full, and forks onto the other runner; both containers continue their
// memory, the files of both root filesystems and of the volume are kept, the endpoint
// follows (the new runner's edge), each fork has its own address; nothing is left in
// the bucket.
func TestPauseCrossGroup(t *testing.T) {
	c := startCross(t)
	ctx := context.Background()

	t.Run("move to another runner and back (its own runner full)", func(t *testing.T) {
		id, first, side0 := c.groupOn(t, "r1")
		t0 := time.Now()
		c.g.sh(t, id, "echo kept > /tmp/v && echo main-root > /tmp/note && echo vol > /shared/f")
		c.shIn(t, id, "side", "echo side-root > /tmp/note")
		side1 := c.side(t, id)
		sideContinues(t, "before the pause", side1, side0, t0)
		ps := c.pause(t, id)
		t.Logf("pause of a two-container group: checkpoint %d bytes", ps.GetCheckpointBytes())
		if st := c.status(t, id); st.GetState() != sandboxv1.State_STATE_PAUSED || st.GetRunnerId() != "r1" {
			t.Fatalf("after pause: %s on %s", st.GetState(), st.GetRunnerId())
		}
		ip1, _ := c.s1.Runner.Get(id)

		t1 := time.Now()
		res, err := c.resume(id, "r2")
		if err != nil {
			t.Fatalf("resume on r2: %v", err)
		}
		t.Logf("resume of a two-container group on another runner (export, import, restore): %v", time.Since(t1))
		if res.GetRunnerId() != "r2" || res.GetMovedFrom() != "r1" || res.GetSandboxId() != id {
			t.Errorf("resume on r2 answered %v, want runner_id r2, moved_from r1", res)
		}
		c.wantOn(t, id, "r2")
		if got := c.counter(t, id, "r2"); got.boot != first.boot || got.count != first.count+1 || got.value != "kept" {
			t.Errorf("main after the move: %+v, want boot %s count %d value kept", got, first.boot, first.count+1)
		}
		side2 := c.side(t, id)
		sideContinues(t, "after the move", side2, side1, t1)
		if code, body, err := c.get(id, "r1"); err == nil && code == 200 {
			t.Errorf("the moved group still answers through r1's edge: %q", body)
		}
		if got := c.shIn(t, id, "main", "cat /tmp/note /shared/f"); got != "main-root\nvol\n" {
			t.Errorf("main's files after the move: %q", got)
		}
		if got := c.shIn(t, id, "side", "cat /tmp/note /shared/f"); got != "side-root\nvol\n" {
			t.Errorf("side's files after the move: %q", got)
		}
		sb2, err := c.s2.Runner.Get(id)
		if err != nil || sb2.IP == "" || sb2.IP == ip1.IP {
			t.Errorf("address on r2 %q (%v), on r1 it was %q: want a new one", sb2.IP, err, ip1.IP)
		}
		for _, ctr := range []string{"main", "side"} {
			if out := strings.TrimSpace(c.shIn(t, id, ctr, "python3 -c "+srcAddrPy)); out != sb2.IP {
				t.Errorf("%s's source address after the move: %q, want r2's %s (the network re-attached)", ctr, out, sb2.IP)
			}
		}
		c.noCheckpointObjects(t, "after the move")

		// Files written between the cycles survive; r2 fills while it is paused, so it
		// moves back to r1.
		c.shIn(t, id, "side", "echo between > /shared/between")
		time.Sleep(300 * time.Millisecond)
		side3 := c.side(t, id)
		c.pause(t, id)
		c.sleeperOn(t, "r2", "7500m")
		t3 := time.Now()
		res, err = c.resume(id)
		if err != nil {
			t.Fatalf("resume with r2 full: %v", err)
		}
		t.Logf("resume of a two-container group elsewhere (its runner full): %v", time.Since(t3))
		if res.GetRunnerId() != "r1" || res.GetMovedFrom() != "r2" {
			t.Errorf("resume with r2 full answered %v, want runner_id r1, moved_from r2", res)
		}
		c.wantOn(t, id, "r1")
		if got := c.counter(t, id, "r1"); got.boot != first.boot || got.count != first.count+2 {
			t.Errorf("main after the move back: %+v, want boot %s count %d", got, first.boot, first.count+2)
		}
		sideContinues(t, "after the move back", c.side(t, id), side3, t3)
		if got := c.shIn(t, id, "main", "cat /shared/between /tmp/note"); got != "between\nmain-root\n" {
			t.Errorf("files after the move back: %q", got)
		}
		c.noCheckpointObjects(t, "after the move back")
	})

	t.Run("fork onto another runner", func(t *testing.T) {
		src, _, _ := c.groupOn(t, "r1")
		var ids []string
		t.Cleanup(func() { c.del(t, ids...) })
		c.g.sh(t, src, "echo source > /tmp/v && echo vol > /shared/f")
		before := c.counter(t, src, "r1")
		sideBefore := c.side(t, src)
		t0 := time.Now()
		res, err := c.state.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: src, Count: 2, RunnerIds: []string{"r2"}}))
		if err != nil {
			t.Fatalf("fork x2 of a group onto r2: %v", err)
		}
		t.Logf("fork x2 of a two-container group onto r2: %v", time.Since(t0))
		for i, f := range res.Msg.GetForks() {
			if f.GetError() != nil {
				t.Errorf("fork %d: %v", i, f.GetError())
			} else {
				ids = append(ids, f.GetSandboxId())
			}
			if f.GetRunnerId() != "r2" {
				t.Errorf("fork %d on %q, want r2", i, f.GetRunnerId())
			}
		}
		if len(ids) != 2 {
			t.FailNow()
		}
		srcSb, _ := c.s1.Runner.Get(src)
		ips := map[string]bool{srcSb.IP: true}
		for i, id := range ids {
			c.g.waitState(t, id, sandboxv1.State_STATE_RUNNING)
			c.wantOn(t, id, "r2")
			sb, err := c.s2.Runner.Get(id)
			if err != nil || sb.IP == "" || ips[sb.IP] {
				t.Errorf("fork %s: IP %q (%v), not its own", id, sb.IP, err)
			}
			ips[sb.IP] = true
			sideContinues(t, "fork "+id, c.side(t, id), sideBefore, t0)
			c.shIn(t, id, "side", "echo fork"+itoa(i)+" > /shared/f")
			c.g.sh(t, id, "echo fork"+itoa(i)+" > /tmp/v")
		}
		for i, id := range ids {
			got := c.counter(t, id, "r2")
			if got.boot != before.boot || got.count != before.count+1 || got.value != "fork"+itoa(i) {
				t.Errorf("fork %s through r2's edge: %+v, want boot %s count %d value fork%d", id, got, before.boot, before.count+1, i)
			}
			if out := c.shIn(t, id, "main", "cat /shared/f"); out != "fork"+itoa(i)+"\n" {
				t.Errorf("fork %s: its volume %q, want its own write", id, out)
			}
		}
		if got := c.counter(t, src, "r1"); got.boot != before.boot || got.count != before.count+1 || got.value != "source" {
			t.Errorf("source after the forks: %+v", got)
		}
		if out := c.shIn(t, src, "side", "cat /shared/f"); out != "vol\n" {
			t.Errorf("the source's volume after the forks: %q", out)
		}
		c.noCheckpointObjects(t, "after the fork")
	})

	c.noCheckpointObjects(t, "at the end")
}
