package sbxcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// fakeSnaps is the fake's snapshot index (guarded by fakeAPI.mu): a snapshot is
// CREATING until its first Get, then READY.
type fakeSnaps struct {
	byID    map[string]*sandboxv1.FileSystemSnapshot
	order   []string
	creates []*sandboxv1.CreateFileSystemSnapshotRequest
	lists   []*sandboxv1.ListFileSystemSnapshotsRequest
	deletes []*sandboxv1.DeleteFileSystemSnapshotRequest
}

func (s *fakeSnaps) add(sandboxID, vol string, trigger sandboxv1.SnapshotTrigger) *sandboxv1.FileSystemSnapshot {
	if s.byID == nil {
		s.byID = map[string]*sandboxv1.FileSystemSnapshot{}
	}
	id := fmt.Sprintf("fss-fake-%d", len(s.order)+1)
	p := &sandboxv1.FileSystemSnapshot{FileSystemSnapshotId: id, State: sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING,
		SourceSandboxId: sandboxID, SourceVolumeName: vol, Trigger: trigger, CreateTime: timestamppb.Now(), ObjectBucket: "local"}
	s.byID[id] = p
	s.order = append(s.order, id)
	return p
}

func fssError(code connect.Code, reason, msg string) error {
	err := connect.NewError(code, errors.New(msg))
	d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: "cwsandbox.com"})
	err.AddDetail(d)
	return err
}

func (f *fakeAPI) CreateFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.CreateFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	sb, err := f.get(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	vol := req.Msg.GetScratchVolumeName()
	if vol == "" {
		vol = "default"
	}
	if !slices.ContainsFunc(sb.GetSpec().GetVolumes(), func(v *sandboxv1.SandboxVolume) bool { return v.GetName() == vol }) {
		return nil, fssError(connect.CodeInvalidArgument, "CWSANDBOX_INVALID_REQUEST", "sandbox "+sb.GetSandboxId()+" has no scratch volume "+vol)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps.creates = append(f.snaps.creates, req.Msg)
	return connect.NewResponse(proto.Clone(f.snaps.add(sb.GetSandboxId(), vol, sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_MANUAL)).(*sandboxv1.FileSystemSnapshot)), nil
}

func (f *fakeAPI) GetFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.GetFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.snaps.byID[req.Msg.GetFileSystemSnapshotId()]
	if !ok {
		return nil, fssError(connect.CodeNotFound, "CWSANDBOX_FSS_NOT_FOUND", "file-system snapshot "+req.Msg.GetFileSystemSnapshotId()+" not found")
	}
	if p.State == sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING && p.GetSourceVolumeName() == "broken" {
		p.State, p.StateReason = sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED, "disk on fire"
	}
	if p.State == sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		p.State, p.SizeBytes, p.CompleteTime = sandboxv1.SnapshotState_SNAPSHOT_STATE_READY, 3<<20, timestamppb.Now()
	}
	return connect.NewResponse(proto.Clone(p).(*sandboxv1.FileSystemSnapshot)), nil
}

func (f *fakeAPI) ListFileSystemSnapshots(_ context.Context, req *connect.Request[sandboxv1.ListFileSystemSnapshotsRequest]) (*connect.Response[sandboxv1.ListFileSystemSnapshotsResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps.lists = append(f.snaps.lists, req.Msg)
	out := &sandboxv1.ListFileSystemSnapshotsResponse{}
	for _, id := range f.snaps.order {
		p := f.snaps.byID[id]
		if p != nil && (req.Msg.GetSourceSandboxId() == "" || p.GetSourceSandboxId() == req.Msg.GetSourceSandboxId()) {
			out.FileSystemSnapshots = append(out.FileSystemSnapshots, proto.Clone(p).(*sandboxv1.FileSystemSnapshot))
		}
	}
	return connect.NewResponse(out), nil
}

func (f *fakeAPI) DeleteFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.DeleteFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snaps.deletes = append(f.snaps.deletes, req.Msg)
	id := req.Msg.GetFileSystemSnapshotId()
	p, ok := f.snaps.byID[id]
	if !ok {
		if req.Msg.GetAllowMissing() {
			return connect.NewResponse(&sandboxv1.FileSystemSnapshot{FileSystemSnapshotId: id}), nil
		}
		return nil, fssError(connect.CodeNotFound, "CWSANDBOX_FSS_NOT_FOUND", "file-system snapshot "+id+" not found")
	}
	delete(f.snaps.byID, id)
	p.State = sandboxv1.SnapshotState_SNAPSHOT_STATE_DELETING
	return connect.NewResponse(p), nil
}

// addWithVolume stores a running sandbox with a scratch volume "work".
func (f *fakeAPI) addWithVolume(id string) {
	f.put(&sandboxv1.Sandbox{SandboxId: id, Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}},
		Volumes:    []*sandboxv1.SandboxVolume{{Name: "work", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{}}}},
	}})
}

func TestSbxSnapshotCreateGetLsRm(t *testing.T) {
	f := newFake(t)
	f.addWithVolume("sbx-1")
	f.addWithVolume("sbx-2")

	out, errs, code := f.sbx("", "snapshot", "create", "sbx-1", "--volume", "work")
	if code != 0 || out != "fss-fake-1\n" {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	if r := f.snaps.creates[0]; r.GetScratchVolumeName() != "work" || r.GetRequestId() == "" {
		t.Errorf("create request %v", r)
	}
	// It waited: the snapshot was read until READY.
	if f.snaps.byID["fss-fake-1"].GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
		t.Error("create did not wait for READY")
	}
	// --no-wait prints the ID of a snapshot still being created.
	out, _, code = f.sbx("", "snapshot", "create", "sbx-2", "--volume", "work", "--no-wait", "-o", "json")
	var raw struct {
		ID    string `json:"fileSystemSnapshotId"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &raw); code != 0 || err != nil || raw.ID != "fss-fake-2" || raw.State != "SNAPSHOT_STATE_CREATING" {
		t.Errorf("create --no-wait -o json: %d %q %v", code, out, err)
	}
	// A volume the sandbox does not have is the server's refusal, with its reason.
	_, errs, code = f.sbx("", "snapshot", "create", "sbx-1", "--volume", "nope")
	if code != 1 || !strings.Contains(errs, "no scratch volume nope") || !strings.Contains(errs, "(CWSANDBOX_INVALID_REQUEST)") {
		t.Errorf("create of a missing volume: %d %q", code, errs)
	}

	out, errs, code = f.sbx("", "snapshot", "get", "fss-fake-1")
	for _, re := range []string{`(?m)^ID:\s+fss-fake-1$`, `(?m)^State:\s+ready$`, `(?m)^Size:\s+3 MiB \(3145728 bytes\)$`,
		`(?m)^Sandbox:\s+sbx-1$`, `(?m)^Volume:\s+work$`, `(?m)^Trigger:\s+manual$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get: no %s in %q (%d %q)", re, out, code, errs)
		}
	}

	out, _, code = f.sbx("", "snapshot", "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!regexp.MustCompile(`^fss-fake-1\s+ready\s+3 MiB\s+sbx-1\s+work\s+manual\s`).MatchString(lines[1]) {
		t.Errorf("ls: %d\n%s", code, out)
	}
	out, _, code = f.sbx("", "snapshot", "ls", "--sandbox", "sbx-2", "-o", "json")
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); code != 0 || err != nil || len(items) != 1 || items[0]["sourceSandboxId"] != "sbx-2" {
		t.Errorf("ls --sandbox -o json: %d %q %v", code, out, err)
	}
	if r := f.snaps.lists[len(f.snaps.lists)-1]; r.GetSourceSandboxId() != "sbx-2" {
		t.Errorf("list request %v", r)
	}

	if _, errs, code = f.sbx("", "snapshot", "rm", "fss-fake-1"); code != 0 {
		t.Fatalf("rm: %d %q", code, errs)
	}
	_, errs, code = f.sbx("", "snapshot", "get", "fss-fake-1")
	if code != 1 || !strings.Contains(errs, "(CWSANDBOX_FSS_NOT_FOUND)") {
		t.Errorf("get after rm: %d %q", code, errs)
	}
	_, errs, code = f.sbx("", "snapshot", "rm", "fss-fake-1")
	if code != 1 || !strings.Contains(errs, "delete fss-fake-1") || !strings.Contains(errs, "(CWSANDBOX_FSS_NOT_FOUND)") {
		t.Errorf("rm of a missing snapshot: %d %q", code, errs)
	}
	for _, flag := range []string{"--missing-ok", "--allow-missing"} {
		if _, errs, code = f.sbx("", "snapshot", "rm", "fss-fake-1", flag); code != 0 {
			t.Errorf("rm %s: %d %q", flag, code, errs)
		}
		if r := f.snaps.deletes[len(f.snaps.deletes)-1]; !r.GetAllowMissing() {
			t.Errorf("rm %s sent %v", flag, r)
		}
	}
}

func TestSbxStopWithSnapshots(t *testing.T) {
	f := newFake(t)
	f.addWithVolume("sbx-1")
	out, errs, code := f.sbx("", "stop", "sbx-1", "--grace", "0s", "--snapshot-volume", "work", "--snapshot-volume", "cache")
	if code != 0 || out != "sbx-1 terminated\nsnapshot work fss-fake-1\nsnapshot cache fss-fake-2\n" {
		t.Fatalf("stop: %d %q %q", code, out, errs)
	}
	if r := f.deleteReqs[0]; !slices.Equal(r.GetSnapshotVolumes(), []string{"work", "cache"}) {
		t.Errorf("delete request %v", r)
	}
	if p := f.snaps.byID["fss-fake-2"]; p.GetTrigger() != sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE || p.GetSourceVolumeName() != "cache" {
		t.Errorf("on-delete snapshot %v", p)
	}
	// stop waited until both were READY.
	for _, id := range []string{"fss-fake-1", "fss-fake-2"} {
		if st := f.snaps.byID[id].GetState(); st != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
			t.Errorf("%s is %v after stop", id, st)
		}
	}

	f.addWithVolume("sbx-2")
	out, _, code = f.sbx("", "stop", "sbx-2", "--grace", "0s", "--snapshot-volume", "work", "-o", "json")
	var raw struct {
		Sandbox struct {
			ID string `json:"sandboxId"`
		} `json:"sandbox"`
		IDs []string `json:"file_system_snapshot_ids"`
	}
	if err := json.Unmarshal([]byte(out), &raw); code != 0 || err != nil || raw.Sandbox.ID != "sbx-2" || !slices.Equal(raw.IDs, []string{"fss-fake-3"}) {
		t.Errorf("stop -o json: %d %q %v", code, out, err)
	}

	// --no-wait-snapshots returns while they are still being created.
	f.addWithVolume("sbx-3")
	out, _, code = f.sbx("", "stop", "sbx-3", "--grace", "0s", "--snapshot-volume", "work", "--no-wait-snapshots")
	if code != 0 || out != "sbx-3 terminated\nsnapshot work fss-fake-4\n" || f.snaps.byID["fss-fake-4"].GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Errorf("stop --no-wait-snapshots: %d %q", code, out)
	}

	// A snapshot that fails: the sandbox is stopped, the ID printed, the failure reported.
	f.addWithVolume("sbx-4")
	out, errs, code = f.sbx("", "stop", "sbx-4", "--grace", "0s", "--snapshot-volume", "broken")
	if code != 1 || out != "sbx-4 terminated\nsnapshot broken fss-fake-5\n" || !strings.Contains(errs, "snapshot of broken: snapshot fss-fake-5 failed: disk on fire") {
		t.Errorf("stop with a failing snapshot: %d %q %q", code, out, errs)
	}

	// --missing-ok would hide the snapshots' fate: the official client refuses the pair too.
	_, errs, code = f.sbx("", "stop", "sbx-2", "--missing-ok", "--snapshot-volume", "work")
	if code != 1 || !strings.Contains(errs, "none of the others can be") {
		t.Errorf("--missing-ok with --snapshot-volume: %d %q", code, errs)
	}
}

func TestSbxRunRestore(t *testing.T) {
	f := newFake(t)
	out, errs, code := f.sbx("", "run", "busybox", "--volume", "work:/work:1Gi", "--volume", "tmp:/tmp", "--restore", "work=fss-9")
	if code != 0 {
		t.Fatalf("run: %d %q %q", code, out, errs)
	}
	sb, err := f.get(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	vs := sb.GetSpec().GetVolumes()
	if len(vs) != 2 || vs[0].GetName() != "work" || vs[0].GetScratch().GetSize() != "1Gi" || vs[0].GetScratch().GetRestoreFromSnapshotId() != "fss-9" ||
		vs[1].GetName() != "tmp" || vs[1].GetScratch().GetRestoreFromSnapshotId() != "" {
		t.Errorf("volumes %v", vs)
	}
	if ms := sb.GetSpec().GetContainers()[0].GetVolumeMounts(); len(ms) != 2 || ms[0].GetMountPath() != "/work" || ms[1].GetVolume() != "tmp" {
		t.Errorf("mounts %v", ms)
	}

	// With several containers the volumes go to the primary.
	out, errs, code = f.sbx("", "run", "--container", "name=a,image=busybox", "--container", "name=b,image=busybox,primary",
		"--volume", "work:/work", "--restore", "work=fss-9")
	if code != 0 {
		t.Fatalf("run --container: %d %q %q", code, out, errs)
	}
	sb, _ = f.get(strings.TrimSpace(out))
	cs := sb.GetSpec().GetContainers()
	if len(cs) != 2 || len(cs[0].GetVolumeMounts()) != 0 || len(cs[1].GetVolumeMounts()) != 1 || cs[1].GetVolumeMounts()[0].GetMountPath() != "/work" {
		t.Errorf("containers %v", cs)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--restore", "work=fss-9"}, "declare it with --volume work:/PATH"},
		{[]string{"--volume", "work:/w", "--restore", "work"}, "want VOLUME=SNAPSHOT"},
		{[]string{"--volume", "work:/w", "--restore", "work=a", "--restore", "work=b"}, "restored twice"},
		{[]string{"--volume", "work"}, "want NAME:/PATH"},
		{[]string{"--volume", "work:rel"}, "want NAME:/PATH"},
		{[]string{"--volume", "w:/a", "--volume", "w:/b"}, "given twice"},
	} {
		_, errs, code := f.sbx("", append([]string{"run", "busybox"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errs, tc.want)
		}
	}
}
