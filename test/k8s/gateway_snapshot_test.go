package k8s

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestGatewayVolumeSnapshot: the public API's file-system snapshots on a Kubernetes
// runner: write into a scratch volume through exec, CreateFileSystemSnapshot, READY, a
// new sandbox restoring it reads the data back; a delete with snapshot_volumes snapshots
// the volume before the Pod goes, and that snapshot restores too.
func TestGatewayVolumeSnapshot(t *testing.T) {
	needCluster(t)
	d := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(d, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(t.Context(), store.Org{ID: "org-a", Name: "org-a"}); err != nil {
		t.Fatal(err)
	}
	blobs, err := dir.Open(filepath.Join(d, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	s := snapshotStackWith(t, blobs)
	_, api, _ := serveGateway(t, gateway.Config{Runners: []runner.Handle{runner.NewLocal("k8s-runner", s.Runner)},
		Index: st.Sandboxes(), Orgs: st.Orgs(), Snapshots: st.Snapshots(), Blobs: blobs, SnapshotBucket: "local"})
	ctx := context.Background()

	create := func(restore string) string {
		t.Helper()
		res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "workspace", MountPath: "/workspace"}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "workspace", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: "64Mi", RestoreFromSnapshotId: restore}}}},
		}}}))
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		id := res.Msg.GetSandboxId()
		gwWait(t, api, id, sandboxv1.State_STATE_RUNNING)
		return id
	}
	run := func(id, script string) string {
		t.Helper()
		ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatal(err)
		}
		if ex.Msg.GetExitCode() != 0 {
			t.Fatalf("exec %q: exit %d: %s", script, ex.Msg.GetExitCode(), ex.Msg.GetStderr())
		}
		return string(ex.Msg.GetStdout())
	}
	waitSnap := func(id string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			res, err := api.GetFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
			if err != nil {
				t.Fatal(err)
			}
			switch res.Msg.GetState() {
			case sandboxv1.SnapshotState_SNAPSHOT_STATE_READY:
				return
			case sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING:
			default:
				t.Fatalf("snapshot %s: %v", id, res.Msg)
			}
			if time.Now().After(deadline) {
				t.Fatalf("snapshot %s still CREATING", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	src := create("")
	run(src, "mkdir -p /workspace/a && echo from-k8s > /workspace/a/b.txt")
	snap, err := api.CreateFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.CreateFileSystemSnapshotRequest{SandboxId: src, ScratchVolumeName: "workspace"}))
	if err != nil {
		t.Fatal(err)
	}
	waitSnap(snap.Msg.GetFileSystemSnapshotId())
	dst := create(snap.Msg.GetFileSystemSnapshotId())
	if got := run(dst, "cat /workspace/a/b.txt"); got != "from-k8s\n" {
		t.Errorf("restored: %q", got)
	}

	run(dst, "echo on-stop > /workspace/c.txt")
	del, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: dst, GracePeriodSeconds: 2, SnapshotVolumes: []string{"workspace"}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(del.Msg.GetFileSystemSnapshotIds()) != 1 {
		t.Fatalf("delete with snapshot: ids %v", del.Msg.GetFileSystemSnapshotIds())
	}
	waitSnap(del.Msg.GetFileSystemSnapshotIds()[0])
	again := create(del.Msg.GetFileSystemSnapshotIds()[0])
	if got := run(again, "cat /workspace/a/b.txt /workspace/c.txt"); got != "from-k8s\non-stop\n" {
		t.Errorf("restored from the snapshot on delete: %q", got)
	}
	for _, id := range []string{src, again} {
		if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id, GracePeriodSeconds: 2})); err != nil {
			t.Error(err)
		}
	}
}

func gwWait(t *testing.T, api sandboxv1connect.SandboxServiceClient, id string, want sandboxv1.State) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := api.GetSandbox(context.Background(), connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if st := res.Msg.GetStatus(); st.GetState() == want {
			return
		} else if time.Now().After(deadline) || st.GetState() == sandboxv1.State_STATE_FAILED {
			t.Fatalf("sandbox %s is %s (%s), want %s", id, st.GetState(), st.GetStateReason(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
