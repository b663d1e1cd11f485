package security

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// restCall is one REST call as some caller makes it (a key, or a console session).
type restCall func(t *testing.T, method, path, body string) (int, []byte)

// scratchSandbox makes, through call, a running sandbox with a scratch volume
// "workspace" holding a file; it is deleted with the test.
func scratchSandbox(t *testing.T, call restCall) string {
	t.Helper()
	code, body := call(t, "POST", "/v1/sandboxes", `{"spec":{
		"volumes":[{"name":"workspace","scratch":{"size":"64Mi"}}],
		"containers":[{"name":"main","image":"busybox","command":"/bin/sh",
			"args":["-c","echo secret-of-b > /workspace/f; trap \"exit 0\" TERM; while true; do sleep 1; done"],
			"volumeMounts":[{"volume":"workspace","mountPath":"/workspace"}]}]}}`)
	var sb struct {
		ID string `json:"sandboxId"`
	}
	if err := json.Unmarshal(body, &sb); code != 200 || err != nil || sb.ID == "" {
		t.Fatalf("create a sandbox with a scratch volume: %d %s", code, body)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/sandboxes/"+sb.ID, "") })
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body := call(t, "GET", "/v1/sandboxes/"+sb.ID, "")
		if code == 200 && strings.Contains(string(body), `"STATE_RUNNING"`) {
			return sb.ID
		}
		if time.Now().After(deadline) || (code == 200 && strings.Contains(string(body), `"STATE_FAILED"`)) {
			t.Fatalf("sandbox %s not running: %d %s", sb.ID, code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restAs is REST calls with key.
func (d *Dev) restAs(key string) restCall {
	return func(t *testing.T, method, path, body string) (int, []byte) {
		t.Helper()
		var v any
		if body != "" {
			v = json.RawMessage(body)
		}
		return d.rest(t, key, method, path, v)
	}
}

// readySnapshot makes, through call (org B's), a scratchSandbox, takes a file-system
// snapshot of it with request_id snapRequestID(sandbox) and waits until it is READY. It
// returns the sandbox's and the snapshot's IDs; both are deleted with the test.
func readySnapshot(t *testing.T, call restCall) (sandboxID, snapshotID string) {
	t.Helper()
	id := scratchSandbox(t, call)
	code, body := call(t, "POST", "/v1/sandboxes/"+id+":snapshot", `{"scratchVolumeName":"workspace","requestId":"`+snapRequestID(id)+`"}`)
	var x struct {
		ID string `json:"fileSystemSnapshotId"`
	}
	if err := json.Unmarshal(body, &x); code != 200 || err != nil || x.ID == "" {
		t.Fatalf("snapshot sandbox %s: %d %s", id, code, body)
	}
	t.Cleanup(func() { call(t, "DELETE", "/v1/fileSystemSnapshots/"+x.ID, "") })
	waitSnapshotReady(t, call, x.ID)
	return id, x.ID
}

// waitSnapshotReady waits until snapshot id, read through call, is READY.
func waitSnapshotReady(t *testing.T, call restCall, id string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body := call(t, "GET", "/v1/fileSystemSnapshots/"+id, "")
		if code == 200 && strings.Contains(string(body), `"SNAPSHOT_STATE_READY"`) {
			return
		}
		if code != 200 || !strings.Contains(string(body), `"SNAPSHOT_STATE_CREATING"`) || time.Now().After(deadline) {
			t.Fatalf("snapshot %s: %d %s", id, code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func snapRequestID(sandboxID string) string { return "snap-of-" + sandboxID }

// restoreSpec is a sandbox restoring snapshot id into its scratch volume (REST JSON).
func restoreSpec(id string) string {
	return `{"spec":{"volumes":[{"name":"workspace","scratch":{"size":"64Mi","restoreFromSnapshotId":"` + id + `"}}],
		"containers":[{"name":"main","image":"busybox","command":"sleep","args":["600"],
			"volumeMounts":[{"volume":"workspace","mountPath":"/workspace"}]}]}}`
}

// wantReason checks that err is a gRPC/Connect error of code with the ErrorInfo reason.
func wantReason(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code || apierr.Reason(err) != reason {
		t.Fatalf("%s: %v, want %s %s", what, err, code, reason)
	}
}

// TestSnapshotTenancy attacks org B's file-system snapshot over gRPC with org A's key:
// A cannot get, list (in full, or by B's sandbox), delete or restore it (in a new
// sandbox's scratch volume) by its ID, nor snapshot B's sandbox, nor replay B's snapshot
// through B's request_id; each answers as for a snapshot that does not exist, and B's
// snapshot is READY and restorable by B afterwards.
func TestSnapshotTenancy(t *testing.T) {
	d := needDev(t)
	b := d.restAs(d.KeyB)
	sbB, snapB := readySnapshot(t, b)
	a := d.sandboxes(d.KeyA)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, err := a.GetFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: snapB}))
	wantReason(t, "A gets B's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	for _, src := range []string{"", sbB} {
		res, err := a.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{SourceSandboxId: src, PageSize: 1000}))
		if err != nil {
			continue // refused outright is fine too
		}
		for _, x := range res.Msg.GetFileSystemSnapshots() {
			if x.GetFileSystemSnapshotId() == snapB || x.GetSourceSandboxId() == sbB {
				t.Fatalf("A lists B's snapshot (source filter %q): %v", src, x)
			}
		}
	}
	_, err = a.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: snapB}))
	wantReason(t, "A deletes B's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = a.CreateFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.CreateFileSystemSnapshotRequest{SandboxId: sbB, ScratchVolumeName: "workspace"}))
	wantReason(t, "A snapshots B's sandbox", err, connect.CodeNotFound, apierr.SandboxNotFound)
	// B's request_id names no snapshot of A's: on A's own sandbox it takes a new snapshot
	// of A's, never replays (nor conflicts with) B's.
	sbA := scratchSandbox(t, d.restAs(d.KeyA))
	own, err := a.CreateFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.CreateFileSystemSnapshotRequest{
		SandboxId: sbA, ScratchVolumeName: "workspace", RequestId: snapRequestID(sbB)}))
	if err != nil || own.Msg.GetFileSystemSnapshotId() == snapB || own.Msg.GetSourceSandboxId() != sbA {
		t.Fatalf("A's snapshot with B's request_id: %v %v", own, err)
	}
	t.Cleanup(func() {
		_, _ = a.DeleteFileSystemSnapshot(context.Background(), connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{
			FileSystemSnapshotId: own.Msg.GetFileSystemSnapshotId()}))
	})
	waitSnapshotReady(t, d.restAs(d.KeyA), own.Msg.GetFileSystemSnapshotId())

	// Restore: a sandbox of A's whose scratch volume restores B's snapshot is refused
	// before anything is made.
	before, err := a.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	sp := &sandboxv1.SandboxSpec{
		Volumes: []*sandboxv1.SandboxVolume{{Name: "workspace", Source: &sandboxv1.SandboxVolume_Scratch{
			Scratch: &sandboxv1.ScratchVolume{Size: "64Mi", RestoreFromSnapshotId: snapB}}}},
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "sleep", Args: []string{"600"},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "workspace", MountPath: "/workspace"}}}},
	}
	res, err := a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if err == nil {
		_, _ = a.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: res.Msg.GetSandboxId()}))
	}
	wantReason(t, "A restores B's snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	after, err := a.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Msg.GetSandboxes()) != len(before.Msg.GetSandboxes()) {
		t.Fatalf("A's refused restore left a sandbox: %d before, %d after", len(before.Msg.GetSandboxes()), len(after.Msg.GetSandboxes()))
	}

	// B's snapshot is intact: READY, and B restores it (the control: the request A made
	// is a good one for B).
	if code, body := b(t, "GET", "/v1/fileSystemSnapshots/"+snapB, ""); code != 200 || !strings.Contains(string(body), `"SNAPSHOT_STATE_READY"`) {
		t.Fatalf("B's snapshot after A's attacks: %d %s", code, body)
	}
	code, body := b(t, "POST", "/v1/sandboxes", restoreSpec(snapB))
	var rb struct {
		ID string `json:"sandboxId"`
	}
	if err := json.Unmarshal(body, &rb); code != 200 || err != nil || rb.ID == "" {
		t.Fatalf("B restores its snapshot: %d %s", code, body)
	}
	b(t, "DELETE", "/v1/sandboxes/"+rb.ID, "")
}
