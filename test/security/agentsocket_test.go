package security

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// sandboxes is the public SandboxService of d as the holder of key sees it.
func (d *Dev) sandboxes(key string) sandboxv1connect.SandboxServiceClient {
	return sandboxv1connect.NewSandboxServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(key)))
}

// runningSandbox creates a sandbox of busybox that prints a line a second (with $SECRET), of runtime
// class class ("": the default), with env, and waits until it runs; it is deleted with
// the test.
func runningSandbox(t *testing.T, c sandboxv1connect.SandboxServiceClient, class string, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := &sandboxv1.SandboxSpec{RuntimeClass: class, Containers: []*sandboxv1.Container{{
		Name: "main", Image: "busybox", Command: "/bin/sh", EnvironmentVariables: env,
		Args: []string{"-c", `trap "exit 0" TERM; while true; do echo "tick $SECRET"; sleep 1; done`},
	}}}
	res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
	if err != nil {
		t.Fatalf("create (class %q): %v", class, err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = c.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	for {
		st, err := c.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		switch st.Msg.GetStatus().GetState() {
		case sandboxv1.State_STATE_RUNNING:
			return id
		case sandboxv1.State_STATE_FAILED, sandboxv1.State_STATE_COMPLETED, sandboxv1.State_STATE_TERMINATED:
			t.Fatalf("sandbox %s ended: %v", id, st.Msg.GetStatus())
		}
		if ctx.Err() != nil {
			t.Fatalf("sandbox %s not running after 60 s", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func execOut(ctx context.Context, c sandboxv1connect.SandboxServiceClient, id string, argv ...string) (string, error) {
	res, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: argv}))
	if err != nil {
		return "", err
	}
	return string(res.Msg.GetStdout()) + string(res.Msg.GetStderr()), nil
}

// TestAgentSocketSwap is issue 15's critical hole, as the probe found it: root in a
// sandbox of org-b replaces its agent socket with a symlink to the socket of org-a's
// sandbox (whose host path the attacker reads off its own mountinfo, plus the victim's
// ID, which we hand it: the worst case), then forces the runner to open new agent
// connections by holding more log streams open than one connection carries. Every exec,
// file read and log line it gets back must be its own sandbox's; the victim's secret must
// never reach it. On runc and on gVisor.
func TestAgentSocketSwap(t *testing.T) {
	d := needDev(t)
	classes := []string{""}
	if local.FindRunsc() != "" {
		classes = append(classes, local.GVisorClass)
	}
	for _, class := range classes {
		name := class
		if name == "" {
			name = "runc"
		}
		t.Run(name, func(t *testing.T) { socketSwap(t, d, class) })
	}
}

// setPolicy replaces the local runner's policy (JSON; "{}" is the empty policy) for the
// rest of the test, and restores the empty policy after it.
func setPolicy(t *testing.T, d *Dev, doc string) {
	t.Helper()
	adm, err := sandbox.NewAdmin(d.API, d.Admin)
	if err != nil {
		t.Fatal(err)
	}
	set := func(doc string) error {
		var m map[string]any
		if err := json.Unmarshal([]byte(doc), &m); err != nil {
			return err
		}
		p, err := structpb.NewStruct(m)
		if err != nil {
			return err
		}
		_, err = adm.Runners.UpdateManagedRunner(context.Background(), connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
			ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "local", Policy: p},
			UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
		}))
		return err
	}
	if err := set(doc); err != nil {
		t.Fatalf("set policy: %v", err)
	}
	t.Cleanup(func() {
		if err := set("{}"); err != nil {
			t.Errorf("restore the empty policy: %v", err)
		}
	})
	time.Sleep(1500 * time.Millisecond) // the runner takes it with its next heartbeat
}

func socketSwap(t *testing.T, d *Dev, class string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if class != "" {
		setPolicy(t, d, `{"constraints": {"security": {"allowed_runtime_classes": ["runc", "`+class+`"]}}}`)
	}
	secretBytes := make([]byte, 12)
	_, _ = rand.Read(secretBytes)
	secret := "victim-" + hex.EncodeToString(secretBytes)
	a, b := d.sandboxes(d.KeyA), d.sandboxes(d.KeyB)
	victim := runningSandbox(t, a, class, map[string]string{"SECRET": secret})
	attacker := runningSandbox(t, b, class, nil)
	if out, err := execOut(ctx, a, victim, "sh", "-c", "echo $SECRET"); err != nil || strings.TrimSpace(out) != secret {
		t.Fatalf("control: the victim's own secret: %q %v", out, err)
	}

	// Where the state dir is: the attacker's mountinfo (the mount of /.sandboxd/run).
	mi, err := execOut(ctx, b, attacker, "cat", "/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for l := range strings.SplitSeq(mi, "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == "/.sandboxd/run" && strings.Contains(f[3], attacker) {
			base := strings.Replace(f[3], attacker, victim, 1) // …/sandboxes/<victim>/run
			targets = append(targets, base+"/agent.sock", filepath.Dir(base)+"/agent.sock")
		}
	}
	if len(targets) == 0 {
		// The run dir's host path is not visible (as it should not be): aim at where a
		// default install keeps it, and at the suite's own data dir.
		for _, root := range []string{d.DataDir, "/var/lib/sandboxd"} {
			base := filepath.Join(root, "sandboxes", victim)
			targets = append(targets, base+"/disk/.sandboxd/run/agent.sock", base+"/run/agent.sock", base+"/agent.sock")
		}
		t.Logf("the attacker sees no host path of its run dir in mountinfo; trying %v", targets)
	} else {
		t.Logf("the attacker read host paths off mountinfo: %v", targets)
	}

	for _, target := range targets {
		swap := `rm -f /.sandboxd/run/agent.sock && ln -s ` + target + ` /.sandboxd/run/agent.sock && ls -l /.sandboxd/run/agent.sock`
		out, err := execOut(ctx, b, attacker, "sh", "-c", swap)
		if err != nil {
			// gVisor: the run dir's socket is the agent's only one, and the runner refuses
			// the symlink the last swap left: the attacker cut itself off. Fail closed.
			if class == "" {
				t.Errorf("runc: the attacker's own exec failed after a swap: %v", err)
			}
			t.Logf("the attacker's agent is unreachable after the previous swap (refused, not followed): %v", err)
			break
		}
		t.Logf("swapped: %s", strings.TrimSpace(out))
		// More concurrent follow streams than two agent connections carry (HTTP/2: 250
		// each), so the runner dials the agent again while they are open. The victim
		// logs its secret: a stream that reached it would show it.
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var leaked []string
		var live atomic.Int64 // streams that got a first log line (data): open through to the agent
		const streams = 600
		for range streams {
			wg.Go(func() {
				st, err := b.StreamLogs(sctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: attacker, Follow: true}))
				if err != nil {
					return
				}
				defer st.Close()
				first := true
				for st.Receive() {
					if first && len(st.Msg().GetData()) > 0 { // an in-band error is no open stream
						live.Add(1)
						first = false
					}
					if bytes.Contains(st.Msg().GetData(), []byte(secret)) {
						mu.Lock()
						leaked = append(leaked, "log stream")
						mu.Unlock()
					}
				}
			})
		}
		// Wait until (nearly) all are open, or none has opened for 5 s (the rest refused).
		for deadline, last, seen := time.Now().Add(60*time.Second), time.Now(), int64(-1); live.Load() < streams-20 && time.Now().Before(deadline) && time.Since(last) < 5*time.Second; {
			if n := live.Load(); n != seen {
				last, seen = time.Now(), n
			}
			time.Sleep(100 * time.Millisecond)
		}
		opened := live.Load()
		if opened < streams-20 {
			if class == "" {
				t.Errorf("only %d of %d log streams opened", opened, streams)
			} else {
				// gVisor: the streams beyond the agent connections already open needed a
				// new dial, which the runner refuses (the socket is now a symlink): the
				// attacker cut itself off. That must be a refusal, checked below.
				t.Logf("%d of %d log streams opened: the others needed a new agent connection, refused", opened, streams)
				if _, err := execOut(ctx, b, attacker, "true"); err == nil || !strings.Contains(err.Error(), "refusing to follow it") {
					t.Errorf("gvisor: %d of %d log streams opened, yet a new agent connection was not refused: %v", opened, streams, err)
				}
			}
		}
		if class == "" {
			// The agent is PID 1: its sockets are the listener and one per connection.
			out, err := execOut(ctx, b, attacker, "sh", "-c", "ls -l /proc/1/fd | grep -c socket")
			t.Logf("the attacker's agent holds %s sockets with %d log streams open (%v)", strings.TrimSpace(out), opened, err)
		}
		for i := range 20 {
			out, err := execOut(ctx, b, attacker, "sh", "-c", "echo $SECRET; cat /proc/1/environ")
			if strings.Contains(out, secret) {
				leaked = append(leaked, "exec")
			}
			if i == 0 {
				t.Logf("exec in the attacker after the swap: %q %v", strings.TrimSpace(out), err)
				// runc: the runner's socket is out of the sandbox's reach, so the swap
				// changes nothing for it.
				if class == "" && err != nil {
					t.Errorf("runc: exec in the attacker after the swap: %v", err)
					if st, gerr := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: attacker})); gerr == nil {
						s := st.Msg.GetStatus()
						t.Logf("the attacker: %s, reason %q, exit code %d, restarts %v", s.GetState(), s.GetStateReason(), s.GetExitCode(), s.GetContainerStatuses())
					}
				}
			}
			rf, err := b.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: attacker, Path: "/proc/1/environ"}))
			if err == nil && bytes.Contains(rf.Msg.GetContent(), []byte(secret)) {
				leaked = append(leaked, "read file")
			}
		}
		stop()
		wg.Wait()
		if len(leaked) > 0 {
			t.Errorf("socket swapped to %s, %d log streams open: the victim's secret reached org-b through %v", target, opened, leaked)
		}
		// The victim is untouched.
		if out, err := execOut(ctx, a, victim, "sh", "-c", "echo $SECRET"); err != nil || strings.TrimSpace(out) != secret {
			t.Errorf("after the attack, the victim's own exec: %q %v", out, err)
		}
	}
}

// TestNoStateDirInMountinfo: what a sandbox reads of its mounts names no host path of
// the runner's state dir (the first step of the socket swap was reading it there), also
// where its agent installs a seccomp program compiled for an earlier sandbox.
func TestNoStateDirInMountinfo(t *testing.T) {
	d := needDev(t)
	classes := []string{""}
	if local.FindRunsc() != "" {
		classes = append(classes, local.GVisorClass)
		setPolicy(t, d, `{"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}}`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.sandboxes(d.KeyB)
	for _, class := range classes {
		// Two of each: under runc the second gets the seccomp program the first's was
		// compiled into, mounted into it (seccompcache.go).
		for range 2 {
			id := runningSandbox(t, c, class, nil)
			out, err := execOut(ctx, c, id, "cat", "/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			for l := range strings.SplitSeq(out, "\n") {
				if strings.Contains(l, d.DataDir) {
					t.Errorf("class %q: mountinfo shows the state dir: %s", class, l)
				}
			}
		}
	}
}
