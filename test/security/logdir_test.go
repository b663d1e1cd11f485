package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
)

// TestExitedSidecarLogDirSwapNotFollowed: the log of a sidecar that has exited is read,
// while its sandbox runs, from where its agent left it, in the container's run dir, which
// root in the container can write. A sidecar replaces its log dir with a symlink to a
// host dir holding a log (another tenant's, or anything on the host) and exits: reading
// its log must never return that log. An honest sidecar that exited beside it keeps its
// log readable, so the read path is the one under attack.
func TestExitedSidecarLogDirSwapNotFollowed(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	host := t.TempDir()
	if err := os.Chmod(host, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := logstore.Open(host, agentconfig.MainLog)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(logstore.Stdout, []byte("HOST-SECRET of another tenant\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()

	logs := agentconfig.StateDir + "/" + agentconfig.LogsDir
	b := d.sandboxes(d.KeyB)
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "main", Image: "busybox", Command: "/bin/sh", Primary: proto.Bool(true),
			Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`}},
		{Name: "side", Image: "busybox", Command: "/bin/sh",
			Args: []string{"-c", "echo side own line; sleep 1; mv " + logs + " " + logs + ".old && ln -s " + host + " " + logs + " && echo swapped; exit 0"}},
		{Name: "honest", Image: "busybox", Command: "/bin/sh",
			Args: []string{"-c", "echo honest line; exit 0"}},
	}}
	res, err := b.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = b.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	exited := func() (bool, *sandboxv1.SandboxStatus) {
		st, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		s := st.Msg.GetStatus()
		n := 0
		for _, c := range s.GetContainerStatuses() {
			if (c.GetName() == "side" || c.GetName() == "honest") && c.GetState() == sandboxv1.State_STATE_COMPLETED {
				n++
			}
		}
		return n == 2 && s.GetState() == sandboxv1.State_STATE_RUNNING, s
	}
	for {
		ok, s := exited()
		if ok {
			break
		}
		if s.GetState() != sandboxv1.State_STATE_RUNNING && s.GetState() != sandboxv1.State_STATE_CREATING {
			t.Fatalf("sandbox ended: %v", s)
		}
		if ctx.Err() != nil {
			t.Fatalf("the sidecars did not complete: %v", s)
		}
		time.Sleep(200 * time.Millisecond)
	}

	read := func(container string) (string, error) {
		st, err := b.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: id, Container: container}))
		if err != nil {
			return "", err
		}
		defer st.Close()
		var got strings.Builder
		for st.Receive() {
			if e := st.Msg().GetError(); e != nil {
				return got.String(), fmt.Errorf("%s: %s", e.GetCode(), e.GetMessage())
			}
			got.Write(st.Msg().GetData())
		}
		return got.String(), st.Err()
	}
	if got, err := read("honest"); err != nil || got != "honest line\n" {
		t.Errorf("log of the honest sidecar that exited: %q %v, want %q", got, err, "honest line\n")
	}
	got, err := read("side")
	t.Logf("log of the swapped sidecar: %q, %v", got, err)
	if strings.Contains(got, "HOST-SECRET") {
		t.Fatalf("the runner followed the sidecar's symlinked log dir: %q", got)
	}
	// A clear refusal naming the container, and no host path of the runner's.
	if err == nil || !strings.Contains(err.Error(), `"side"`) || strings.Contains(err.Error(), d.DataDir) || strings.Contains(err.Error(), host) {
		t.Errorf("log of the swapped sidecar: %v, want an error naming the container and no host path", err)
	}

	// Once the sandbox ended, its archived log is not the host's either.
	if _, err := b.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := b.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		if st.Msg.GetStatus().GetState() == sandboxv1.State_STATE_TERMINATED {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("not terminated")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, err := read("side"); strings.Contains(got, "HOST-SECRET") {
		t.Fatalf("the archived log of the swapped sidecar is the host's: %q %v", got, err)
	}
	if fi, err := os.Lstat(filepath.Join(host, agentconfig.MainLog+".log")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the host's log was moved or changed: %v %v", fi, err)
	}
}
