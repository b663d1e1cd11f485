package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
)

// snapServer is a SandboxService with an in-memory snapshot index: it records what the
// SDK sends and answers like the gateway (CREATING, then READY after readyAfter Gets).
type snapServer struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler

	mu         sync.Mutex
	snaps      map[string]*sandboxv1.FileSystemSnapshot
	order      []string
	gets       map[string]int
	readyAfter int
	failWith   string // the FAILED state_reason new snapshots end in, if set
	creates    []*sandboxv1.CreateFileSystemSnapshotRequest
	lists      []*sandboxv1.ListFileSystemSnapshotsRequest
	deletes    []*sandboxv1.DeleteFileSystemSnapshotRequest
	sbDeletes  []*sandboxv1.DeleteSandboxRequest
	created    *sandboxv1.CreateSandboxRequest
	// createErrs are returned by the next CreateFileSystemSnapshot calls, in order.
	createErrs []error
	// loseDeleteAnswer makes the next delete succeed but answer UNAVAILABLE.
	loseDeleteAnswer bool
}

func (s *snapServer) CreateFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.CreateFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates = append(s.creates, req.Msg)
	if len(s.createErrs) > 0 {
		err := s.createErrs[0]
		s.createErrs = s.createErrs[1:]
		return nil, err
	}
	vol := req.Msg.GetScratchVolumeName()
	if vol == "" {
		vol = "default"
	}
	return connect.NewResponse(s.add(req.Msg.GetSandboxId(), vol, sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_MANUAL)), nil
}

func (s *snapServer) add(sandboxID, vol string, trigger sandboxv1.SnapshotTrigger) *sandboxv1.FileSystemSnapshot {
	id := fmt.Sprintf("fss-%d", len(s.order)+1)
	p := &sandboxv1.FileSystemSnapshot{FileSystemSnapshotId: id, State: sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING,
		SourceSandboxId: sandboxID, SourceVolumeName: vol, Trigger: trigger, CreateTime: timestamppb.Now()}
	s.snaps[id] = p
	s.order = append(s.order, id)
	return p
}

func (s *snapServer) GetFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.GetFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.snaps[req.Msg.GetFileSystemSnapshotId()]
	if !ok {
		return nil, apiError(connect.CodeNotFound, ReasonSnapshotNotFound, nil)
	}
	s.gets[p.GetFileSystemSnapshotId()]++
	if p.GetState() == sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING && s.gets[p.GetFileSystemSnapshotId()] >= s.readyAfter {
		if s.failWith != "" {
			p.State, p.StateReason = sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED, s.failWith
		} else {
			p.State, p.SizeBytes, p.CompleteTime = sandboxv1.SnapshotState_SNAPSHOT_STATE_READY, 4096, timestamppb.Now()
		}
	}
	return connect.NewResponse(p), nil
}

func (s *snapServer) ListFileSystemSnapshots(_ context.Context, req *connect.Request[sandboxv1.ListFileSystemSnapshotsRequest]) (*connect.Response[sandboxv1.ListFileSystemSnapshotsResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists = append(s.lists, req.Msg)
	// One snapshot a page, the token is the next index: the SDK must follow it.
	start := 0
	if t := req.Msg.GetPageToken(); t != "" {
		_, _ = fmt.Sscanf(t, "%d", &start)
	}
	res := &sandboxv1.ListFileSystemSnapshotsResponse{}
	for i := start; i < len(s.order); i++ {
		p := s.snaps[s.order[i]]
		if p == nil || (req.Msg.GetSourceSandboxId() != "" && p.GetSourceSandboxId() != req.Msg.GetSourceSandboxId()) {
			continue
		}
		res.FileSystemSnapshots = append(res.FileSystemSnapshots, p)
		if i+1 < len(s.order) {
			res.NextPageToken = fmt.Sprint(i + 1)
		}
		break
	}
	return connect.NewResponse(res), nil
}

func (s *snapServer) DeleteFileSystemSnapshot(_ context.Context, req *connect.Request[sandboxv1.DeleteFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletes = append(s.deletes, req.Msg)
	id := req.Msg.GetFileSystemSnapshotId()
	p, ok := s.snaps[id]
	if !ok {
		// Like a server that ignores allow_missing: the SDK must absorb it.
		return nil, apiError(connect.CodeNotFound, ReasonSnapshotNotFound, nil)
	}
	delete(s.snaps, id)
	p.State = sandboxv1.SnapshotState_SNAPSHOT_STATE_DELETING
	if s.loseDeleteAnswer {
		s.loseDeleteAnswer = false
		return nil, apiError(connect.CodeUnavailable, ReasonBackendUnavailable, nil)
	}
	return connect.NewResponse(p), nil
}

func (s *snapServer) CreateSandbox(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created = req.Msg
	return connect.NewResponse(&sandboxv1.Sandbox{SandboxId: "sb-1", Spec: req.Msg.GetSandbox().GetSpec(),
		Status: &sandboxv1.SandboxStatus{State: sandboxv1.State_STATE_CREATING}}), nil
}

func (s *snapServer) DeleteSandbox(_ context.Context, req *connect.Request[sandboxv1.DeleteSandboxRequest]) (*connect.Response[sandboxv1.DeleteSandboxResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sbDeletes = append(s.sbDeletes, req.Msg)
	res := &sandboxv1.DeleteSandboxResponse{Sandbox: &sandboxv1.Sandbox{SandboxId: req.Msg.GetSandboxId(),
		Status: &sandboxv1.SandboxStatus{State: sandboxv1.State_STATE_TERMINATED}}}
	for _, v := range req.Msg.GetSnapshotVolumes() {
		res.FileSystemSnapshotIds = append(res.FileSystemSnapshotIds, s.add(req.Msg.GetSandboxId(), v, sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE).GetFileSystemSnapshotId())
	}
	return connect.NewResponse(res), nil
}

func newSnapServer(t *testing.T) (*snapServer, *Client) {
	t.Helper()
	s := &snapServer{snaps: map[string]*sandboxv1.FileSystemSnapshot{}, gets: map[string]int{}, readyAfter: 2}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(s))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New("http://"+ln.Addr().String(), "k", WithDataPlane(DataPlaneGateway))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestSDKSnapshotCreateWaitsReady(t *testing.T) {
	srv, c := newSnapServer(t)
	ctx := context.Background()
	snap, err := c.Sandbox("sb-1").Snapshot(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	if snap.ID != "fss-1" || snap.State != SnapshotReady || snap.SizeBytes != 4096 || snap.SourceSandboxID != "sb-1" ||
		snap.SourceVolume != "work" || snap.Trigger != TriggerManual || snap.CreatedAt.IsZero() || snap.CompletedAt.IsZero() {
		t.Errorf("snapshot %+v", snap)
	}
	if srv.gets["fss-1"] != 2 {
		t.Errorf("polled %d times, want until READY (2)", srv.gets["fss-1"])
	}
	if len(srv.creates) != 1 || srv.creates[0].GetScratchVolumeName() != "work" || srv.creates[0].GetRequestId() == "" {
		t.Errorf("create requests %v", srv.creates)
	}
	if snap.State.String() != "ready" || snap.Trigger.String() != "manual" || TriggerOnDelete.String() != "on_delete" {
		t.Errorf("names %s %s", snap.State, snap.Trigger)
	}

	// NoWait returns the CREATING snapshot without a single Get.
	snap, err = c.Sandbox("sb-1").Snapshot(ctx, "", NoWait())
	if err != nil || snap.State != SnapshotCreating || srv.gets[snap.ID] != 0 || srv.creates[1].GetScratchVolumeName() != "" {
		t.Errorf("no-wait: %+v, %v, %d gets", snap, err, srv.gets[snap.ID])
	}
	if ready, err := c.WaitSnapshot(ctx, snap.ID); err != nil || ready.State != SnapshotReady {
		t.Errorf("WaitSnapshot: %+v, %v", ready, err)
	}
}

func TestSDKSnapshotRetriesWithSameRequestID(t *testing.T) {
	srv, c := newSnapServer(t)
	srv.createErrs = []error{apiError(connect.CodeUnavailable, ReasonSnapshotInflightLimit, nil)}
	if _, err := c.Sandbox("sb-1").Snapshot(context.Background(), "work", NoWait()); err != nil {
		t.Fatal(err)
	}
	if len(srv.creates) != 2 || srv.creates[0].GetRequestId() != srv.creates[1].GetRequestId() {
		t.Errorf("a retried create must resend its request ID: %v", srv.creates)
	}
	// A limit is not retried.
	srv.createErrs = []error{apiError(connect.CodeResourceExhausted, ReasonSnapshotQuotaExceeded, nil)}
	n := len(srv.creates)
	_, err := c.Sandbox("sb-1").Snapshot(context.Background(), "work")
	if !errors.Is(err, ErrSnapshotQuotaExceeded) || len(srv.creates) != n+1 {
		t.Errorf("quota: %v after %d calls", err, len(srv.creates)-n)
	}
}

func TestSDKSnapshotFailed(t *testing.T) {
	srv, c := newSnapServer(t)
	srv.failWith = "volume too large"
	snap, err := c.Sandbox("sb-1").Snapshot(context.Background(), "work")
	var se *SnapshotError
	if !errors.As(err, &se) || !errors.Is(err, ErrSnapshotFailed) || se.ID != "fss-1" || !strings.Contains(err.Error(), "volume too large") {
		t.Fatalf("err %v", err)
	}
	if snap == nil || snap.State != SnapshotFailed {
		t.Errorf("snapshot %+v", snap)
	}
}

func TestSDKSnapshotGetListDelete(t *testing.T) {
	srv, c := newSnapServer(t)
	ctx := context.Background()
	for _, sb := range []string{"sb-1", "sb-2", "sb-1"} {
		if _, err := c.Sandbox(sb).Snapshot(ctx, "v", NoWait()); err != nil {
			t.Fatal(err)
		}
	}
	all, err := c.ListSnapshots(ctx, SnapshotListOptions{PageSize: 1})
	if err != nil || len(all) != 3 || len(srv.lists) != 3 || srv.lists[0].GetPageSize() != 1 {
		t.Fatalf("list: %d snapshots in %d pages, %v", len(all), len(srv.lists), err)
	}
	mine, err := c.ListSnapshots(ctx, SnapshotListOptions{SourceSandboxID: "sb-1"})
	var ids []string
	for _, s := range mine {
		ids = append(ids, s.ID)
	}
	if err != nil || !slices.Equal(ids, []string{"fss-1", "fss-3"}) || srv.lists[len(srv.lists)-1].GetSourceSandboxId() != "sb-1" {
		t.Errorf("filtered list %v, %v", ids, err)
	}

	if s, err := c.GetSnapshot(ctx, "fss-2"); err != nil || s.SourceSandboxID != "sb-2" {
		t.Errorf("get: %+v %v", s, err)
	}
	if err := c.DeleteSnapshot(ctx, "fss-2", false); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSnapshot(ctx, "fss-2")
	if !errors.Is(err, ErrSnapshotNotFound) || errors.Is(err, ErrNotFound) || ReasonOf(err) != ReasonSnapshotNotFound {
		t.Errorf("get after delete: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, "fss-2", false); !errors.Is(err, ErrSnapshotNotFound) {
		t.Errorf("delete missing: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, "fss-2", true); err != nil {
		t.Errorf("delete missing, allowed: %v", err)
	}
	if d := srv.deletes[len(srv.deletes)-1]; !d.GetAllowMissing() || d.GetFileSystemSnapshotId() != "fss-2" {
		t.Errorf("delete request %v", d)
	}
	// A retry that finds the snapshot gone (the first attempt deleted it, its answer was
	// lost) has done its job.
	srv.loseDeleteAnswer = true
	n := len(srv.deletes)
	if err := c.DeleteSnapshot(ctx, "fss-3", false); err != nil || len(srv.deletes) != n+2 {
		t.Errorf("delete with a lost answer: %v after %d calls", err, len(srv.deletes)-n)
	}
}

func TestSDKStopWithSnapshots(t *testing.T) {
	srv, c := newSnapServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := c.Sandbox("sb-1").StopWithSnapshots(ctx, 0, []string{"work", "cache"})
	if err != nil || !slices.Equal(ids, []string{"fss-1", "fss-2"}) {
		t.Fatalf("ids %v, %v", ids, err)
	}
	if d := srv.sbDeletes[0]; !slices.Equal(d.GetSnapshotVolumes(), []string{"work", "cache"}) {
		t.Errorf("delete request %v", d)
	}
	if s, _ := c.GetSnapshot(ctx, "fss-2"); s.Trigger != TriggerOnDelete || s.SourceVolume != "cache" {
		t.Errorf("on-delete snapshot %+v", s)
	}
	// Plain Stop sends none.
	if err := c.Sandbox("sb-1").Stop(ctx, 0); err != nil || len(srv.sbDeletes[1].GetSnapshotVolumes()) != 0 {
		t.Errorf("stop: %v, %v", err, srv.sbDeletes[1])
	}
}

func TestSDKSpecVolumes(t *testing.T) {
	srv, c := newSnapServer(t)
	_, err := c.Create(context.Background(), Spec{Image: "busybox", Volumes: []ScratchVolume{
		{Name: "work", Size: "1Gi", MountPath: "/work", RestoreFrom: "fss-9"},
		{Name: "tmp", Memory: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sp := srv.created.GetSandbox().GetSpec()
	vs := sp.GetVolumes()
	if len(vs) != 2 || vs[0].GetName() != "work" || vs[0].GetScratch().GetSize() != "1Gi" || vs[0].GetScratch().GetRestoreFromSnapshotId() != "fss-9" ||
		vs[1].GetScratch().GetMedium() != sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY {
		t.Errorf("volumes %v", vs)
	}
	ms := sp.GetContainers()[0].GetVolumeMounts()
	if len(ms) != 1 || ms[0].GetVolume() != "work" || ms[0].GetMountPath() != "/work" {
		t.Errorf("mounts %v", ms)
	}

	_, err = c.Create(context.Background(), Spec{Containers: []Container{
		{Name: "a", Image: "busybox", Mounts: []Mount{{Volume: "work", Path: "/w", ReadOnly: true}}},
		{Name: "b", Image: "busybox", Mounts: []Mount{{Volume: "work", Path: "/data"}}},
	}, Volumes: []ScratchVolume{{Name: "work"}}})
	if err != nil {
		t.Fatal(err)
	}
	cs := srv.created.GetSandbox().GetSpec().GetContainers()
	if m := cs[0].GetVolumeMounts(); len(m) != 1 || m[0].GetMountPath() != "/w" || !m[0].GetReadOnly() {
		t.Errorf("container a mounts %v", m)
	}
	if m := cs[1].GetVolumeMounts(); len(m) != 1 || m[0].GetMountPath() != "/data" || m[0].GetReadOnly() {
		t.Errorf("container b mounts %v", m)
	}

	for name, spec := range map[string]Spec{
		"no name":        {Volumes: []ScratchVolume{{MountPath: "/w"}}},
		"twice":          {Volumes: []ScratchVolume{{Name: "w"}, {Name: "w"}}},
		"undeclared":     {Containers: []Container{{Name: "a", Image: "x", Mounts: []Mount{{Volume: "nope", Path: "/n"}}}}},
		"no path":        {Containers: []Container{{Name: "a", Image: "x", Mounts: []Mount{{Volume: "w"}}}}, Volumes: []ScratchVolume{{Name: "w"}}},
		"mountpath+ctrs": {Containers: []Container{{Name: "a", Image: "x"}}, Volumes: []ScratchVolume{{Name: "w", MountPath: "/w"}}},
	} {
		if _, err := c.Create(context.Background(), spec); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSDKSnapshotErrorTyping(t *testing.T) {
	for reason, want := range map[string]error{
		ReasonSnapshotNotFound:          ErrSnapshotNotFound,
		ReasonSnapshotNotReady:          ErrSnapshotNotReady,
		ReasonSnapshotNotSupported:      ErrSnapshotNotSupported,
		ReasonSnapshotSizeExceeded:      ErrSnapshotSizeExceeded,
		ReasonSnapshotQuotaExceeded:     ErrSnapshotQuotaExceeded,
		ReasonSnapshotBucketMismatch:    ErrSnapshotBucketMismatch,
		ReasonSnapshotBackendThrottled:  ErrSnapshotThrottled,
		ReasonSnapshotInflightLimit:     ErrSnapshotThrottled,
		ReasonSnapshotRestoreFailed:     ErrSnapshotFailed,
		ReasonSnapshotBucketUnavailable: ErrSnapshotFailed,
		ReasonSnapshotWaitTimeout:       ErrTimeout,
	} {
		err := fromRPC(apiError(connect.CodeFailedPrecondition, reason, nil))
		if !errors.Is(err, want) {
			t.Errorf("%s: not errors.Is %v", reason, want)
		}
		for _, other := range []error{ErrSnapshotNotFound, ErrSnapshotNotReady, ErrSnapshotSizeExceeded, ErrSnapshotFailed} {
			if !errors.Is(want, other) && errors.Is(err, other) {
				t.Errorf("%s: also errors.Is %v", reason, other)
			}
		}
	}
	// A snapshot's NOT_FOUND is not a sandbox's.
	if err := fromRPC(apiError(connect.CodeNotFound, ReasonSnapshotNotFound, nil)); errors.Is(err, ErrNotFound) {
		t.Error("FSS_NOT_FOUND is ErrNotFound")
	}
	for reason, retry := range map[string]bool{
		ReasonSnapshotInflightLimit: true, ReasonSnapshotBackendThrottled: true,
		ReasonSnapshotSizeExceeded: false, ReasonSnapshotQuotaExceeded: false,
	} {
		if got := isRetryable(fromRPC(apiError(connect.CodeResourceExhausted, reason, nil))); got != retry {
			t.Errorf("%s retryable = %v", reason, got)
		}
	}
}
