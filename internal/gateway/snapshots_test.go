package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// snapRunner is an acceptingRunner whose sandboxes run at once and that takes snapshots
// as a real runner does (runner.SnapshotHandle): a job is CREATING until the test
// finishes it (finish puts the archive into the blob store and reports it READY), and a
// job it never had is FAILED.
type snapRunner struct {
	acceptingRunner
	blobs       blob.Store
	noSnapshots bool
	// legacyUnknown: a job it does not know is answered as a runner of an earlier
	// release did, FAILED with no completion time and without Unknown.
	legacyUnknown bool
	// refuse is SnapshotVolume's (and DeleteWithSnapshots') error when set.
	refuse error

	smu  sync.Mutex
	jobs map[string]runner.SnapshotJob
	keys map[string]string // snapshot ID → blob key
	bkts map[string]string // snapshot ID → SnapshotTarget.Bucket
	// buckets are the stores of other buckets than the platform's (finish puts there).
	buckets  map[string]blob.Store
	targets  []runner.SnapshotTarget
	restores []map[string]runner.SnapshotSource
	deletes  int
}

var _ runner.SnapshotHandle = (*snapRunner)(nil)

func newSnapRunner(id string, blobs blob.Store) *snapRunner {
	return &snapRunner{acceptingRunner: acceptingRunner{id: id}, blobs: blobs, jobs: map[string]runner.SnapshotJob{}, keys: map[string]string{},
		bkts: map[string]string{}, buckets: map[string]blob.Store{}}
}

func (r *snapRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	sb, err := r.acceptingRunner.Create(ctx, req)
	if err != nil {
		return sb, err
	}
	r.mu.Lock()
	sb.State = runner.StateRunning
	r.got[sb.ID] = sb
	r.mu.Unlock()
	r.smu.Lock()
	r.restores = append(r.restores, req.Restores)
	r.smu.Unlock()
	return sb, nil
}

func (r *snapRunner) setState(id string, st runner.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.got[id]
	sb.State = st
	if st.Terminal() {
		sb.EndedAt = time.Now()
	}
	r.got[id] = sb
}

func (r *snapRunner) Delete(ctx context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	r.smu.Lock()
	r.deletes++
	r.smu.Unlock()
	if _, err := r.Get(ctx, id); err != nil {
		return runner.Sandbox{}, err
	}
	r.setState(id, runner.StateTerminated)
	return r.Get(ctx, id)
}

func (r *snapRunner) Capacity(ctx context.Context) (runner.Capacity, error) {
	c, err := r.acceptingRunner.Capacity(ctx)
	c.NoSnapshots = r.noSnapshots
	return c, err
}

func (r *snapRunner) SnapshotVolume(ctx context.Context, id string, t runner.SnapshotTarget) (runner.SnapshotJob, error) {
	if r.refuse != nil {
		return runner.SnapshotJob{}, r.refuse
	}
	sb, err := r.Get(ctx, id)
	if err != nil {
		return runner.SnapshotJob{}, err
	}
	if sb.State != runner.StateRunning {
		return runner.SnapshotJob{}, runner.ErrNotRunning
	}
	return r.start(id, t), nil
}

func (r *snapRunner) start(id string, t runner.SnapshotTarget) runner.SnapshotJob {
	r.smu.Lock()
	defer r.smu.Unlock()
	r.targets = append(r.targets, t)
	if j, ok := r.jobs[t.SnapshotID]; ok {
		return j
	}
	j := runner.SnapshotJob{SnapshotID: t.SnapshotID, SandboxID: id, Volume: t.Volume, State: runner.SnapshotCreating}
	r.jobs[t.SnapshotID], r.keys[t.SnapshotID], r.bkts[t.SnapshotID] = j, t.BlobKey, t.Bucket
	return j
}

func (r *snapRunner) GetSnapshotJob(_ context.Context, snapshotID string) (runner.SnapshotJob, error) {
	r.smu.Lock()
	defer r.smu.Unlock()
	j, ok := r.jobs[snapshotID]
	if !ok {
		return runner.SnapshotJob{SnapshotID: snapshotID, State: runner.SnapshotFailed, Reason: apierr.FSSCreateFailed, Message: "no such job on this runner", Unknown: !r.legacyUnknown}, nil
	}
	return j, nil
}

func (r *snapRunner) DeleteWithSnapshots(ctx context.Context, id string, grace time.Duration, targets []runner.SnapshotTarget) (runner.Sandbox, []runner.SnapshotJob, error) {
	if r.refuse != nil {
		return runner.Sandbox{}, nil, r.refuse
	}
	if _, err := r.Get(ctx, id); err != nil {
		return runner.Sandbox{}, nil, err
	}
	var jobs []runner.SnapshotJob
	for _, t := range targets {
		jobs = append(jobs, r.start(id, t))
	}
	r.setState(id, runner.StateTerminating)
	sb, _ := r.Get(ctx, id)
	return sb, jobs, nil
}

// finish uploads content as snapshot id's archive and reports the job READY, with
// contentBytes of files.
func (r *snapRunner) finish(t *testing.T, id string, content []byte, contentBytes int64) {
	t.Helper()
	r.smu.Lock()
	key, st := r.keys[id], r.blobs
	if b := r.bkts[id]; b != "" {
		st = r.buckets[b]
	}
	r.smu.Unlock()
	if key == "" || st == nil {
		t.Fatalf("runner %s has no job %s (or no store of its bucket)", r.id, id)
	}
	if _, err := st.Put(context.Background(), key, bytes.NewReader(content), int64(len(content))); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	r.smu.Lock()
	defer r.smu.Unlock()
	j := r.jobs[id]
	j.State, j.SizeBytes, j.Digest, j.ContentBytes, j.Pause, j.CompleteTime = runner.SnapshotReady, int64(len(content)), hex.EncodeToString(sum[:]), contentBytes, 3*time.Millisecond, time.Now()
	r.jobs[id] = j
}

func (r *snapRunner) fail(id, reason, msg string) {
	r.smu.Lock()
	defer r.smu.Unlock()
	j := r.jobs[id]
	j.State, j.Reason, j.Message, j.CompleteTime = runner.SnapshotFailed, reason, msg, time.Now()
	r.jobs[id] = j
}

// snapEnv is a gateway with snapshots: a SQLite store, a directory blob store.
type snapEnv struct {
	dir   string
	st    store.Store
	blobs blob.Store
}

func newSnapEnv(t *testing.T) *snapEnv {
	t.Helper()
	d := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(d, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{testOrg, otherOrg} {
		if _, err := st.Orgs().Create(t.Context(), store.Org{ID: o, Name: o}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := dir.Open(filepath.Join(d, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return &snapEnv{dir: d, st: st, blobs: b}
}

// server is a new gateway (a "restart" when called again) over the env's store.
func (e *snapEnv) server(t *testing.T, grace time.Duration, runners ...runner.Handle) *Server {
	t.Helper()
	return e.serverWith(t, grace, SnapshotLimits{MaxInFlightPerSandbox: 64}, runners...)
}

// serverWith is server with the snapshot limits given.
func (e *snapEnv) serverWith(t *testing.T, grace time.Duration, limits SnapshotLimits, runners ...runner.Handle) *Server {
	t.Helper()
	keys, err := auth.OpenKeyring(filepath.Join(e.dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: runners, Index: e.st.Sandboxes(), Orgs: e.st.Orgs(),
		Snapshots: e.st.Snapshots(), Blobs: e.blobs, SnapshotBucket: "local", OrphanGrace: grace,
		FSS: FSSOptions{Limits: limits}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

const otherOrg = "org-b"

func asOther(ctx context.Context) context.Context {
	return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k2", Org: otherOrg, Role: auth.RoleUser})
}

func wantReason(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
		t.Fatalf("%s: %v (reason %q), want %v %s", what, err, apierr.Reason(err), code, reason)
	}
}

func scratch(name, size, restore string) *sandboxv1.SandboxVolume {
	return &sandboxv1.SandboxVolume{Name: name, Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{Size: size, RestoreFromSnapshotId: restore}}}
}

// createWith creates a sandbox with vols, mounted under /v/<name>.
// newSnapSandbox is a gateway with snapshots on one runner, r1, and a sandbox of the
// test organization with a scratch volume "workspace" on it.
func newSnapSandbox(t *testing.T) (*Server, *snapRunner, context.Context, *sandboxv1.Sandbox) {
	t.Helper()
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	sb, err := createWith(t, s, ctx, scratch("workspace", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	return s, r, ctx, sb
}

func createWith(t *testing.T, s *Server, ctx context.Context, vols ...*sandboxv1.SandboxVolume) (*sandboxv1.Sandbox, error) {
	t.Helper()
	c := &sandboxv1.Container{Image: "python:3.11"}
	for _, v := range vols {
		c.VolumeMounts = append(c.VolumeMounts, &sandboxv1.VolumeMount{Volume: v.GetName(), MountPath: "/v/" + v.GetName()})
	}
	res, err := s.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{c}, Volumes: vols}}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func snapshotOf(t *testing.T, s *Server, ctx context.Context, sandboxID, volume, requestID string) (*sandboxv1.FileSystemSnapshot, error) {
	t.Helper()
	res, err := s.CreateFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.CreateFileSystemSnapshotRequest{
		SandboxId: sandboxID, ScratchVolumeName: volume, RequestId: requestID}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func getSnap(t *testing.T, s *Server, ctx context.Context, id string) (*sandboxv1.FileSystemSnapshot, error) {
	t.Helper()
	res, err := s.GetFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// TestSnapshotCreateGetRestore: the whole manual flow. A snapshot of the default scratch
// volume is CREATING, recorded under fss/<org>/<id>.tar.zst in the configured bucket;
// Get asks the runner and shows READY as soon as it is; a new sandbox restoring it gets
// Restores[volume] with the archive's key, digest and sizes; another organization sees
// none of it (NOT_FOUND on get, delete and restore).
func TestSnapshotCreateGetRestore(t *testing.T) {
	s, r, ctx, sb := newSnapSandbox(t)
	snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if snap.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING || snap.GetSourceSandboxId() != sb.GetSandboxId() ||
		snap.GetSourceVolumeName() != "workspace" || snap.GetTrigger() != sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_MANUAL ||
		snap.GetObjectBucket() != "local" || snap.GetCreateTime() == nil || snap.GetFileSystemSnapshotId() == "" {
		t.Fatalf("create = %v", snap)
	}
	id := snap.GetFileSystemSnapshotId()
	if len(r.targets) != 1 || r.targets[0].BlobKey != "fss/"+testOrg+"/"+id+".tar.zst" || r.targets[0].Volume != "workspace" || r.targets[0].SnapshotID != id {
		t.Fatalf("runner was asked %+v", r.targets)
	}
	if got, err := getSnap(t, s, ctx, id); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("get while the runner works: %v %v", got, err)
	}
	content := []byte("an archive")
	r.finish(t, id, content, 5<<20)
	got, err := getSnap(t, s, ctx, id)
	if err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY || got.GetSizeBytes() != int64(len(content)) || got.GetCompleteTime() == nil {
		t.Fatalf("get once the runner is done: %v %v", got, err)
	}

	// Restore: the runner gets the archive to fill the volume from.
	if _, err := createWith(t, s, ctx, scratch("workspace", "", id)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	want := runner.SnapshotSource{SnapshotID: id, BlobKey: "fss/" + testOrg + "/" + id + ".tar.zst", Digest: hex.EncodeToString(sum[:]),
		SizeBytes: int64(len(content)), ContentBytes: 5 << 20}
	if last := r.restores[len(r.restores)-1]; len(last) != 1 || last["workspace"] != want {
		t.Fatalf("the runner got restores %v, want workspace: %+v", last, want)
	}
	// A sized volume too small for the content.
	_, err = createWith(t, s, ctx, scratch("workspace", "1Mi", id))
	wantReason(t, "restore into a volume smaller than the content", err, connect.CodeFailedPrecondition, apierr.FSSSizeExceeded)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.volumes[0].scratch.size" {
		t.Fatalf("violations %v", vs)
	}
	// Unknown id.
	_, err = createWith(t, s, ctx, scratch("workspace", "", "nope"))
	wantReason(t, "restore from an unknown snapshot", err, connect.CodeNotFound, apierr.FSSNotFound)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "sandbox.spec.volumes[0].scratch.restore_from_snapshot_id" {
		t.Fatalf("violations %v", vs)
	}

	// Another organization: NOT_FOUND everywhere, and no trace in its list.
	other := asOther(t.Context())
	_, err = getSnap(t, s, other, id)
	wantReason(t, "another org's get", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = s.DeleteFileSystemSnapshot(other, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	wantReason(t, "another org's delete", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = createWith(t, s, other, scratch("workspace", "", id))
	wantReason(t, "another org's restore", err, connect.CodeNotFound, apierr.FSSNotFound)
	if l, err := s.ListFileSystemSnapshots(other, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{})); err != nil || len(l.Msg.GetFileSystemSnapshots()) != 0 {
		t.Fatalf("another org's list: %v %v", l, err)
	}
	_, err = snapshotOf(t, s, other, sb.GetSandboxId(), "", "")
	wantReason(t, "a snapshot of another org's sandbox", err, connect.CodeNotFound, apierr.SandboxNotFound)
	if x, err := s.DeleteFileSystemSnapshot(other, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id, AllowMissing: true})); err != nil || x.Msg.GetFileSystemSnapshotId() != "" {
		t.Fatalf("another org's delete with allow_missing: %v %v", x, err)
	}
	if got, err := getSnap(t, s, ctx, id); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
		t.Fatalf("after another org's delete: %v %v", got, err)
	}
}

// TestSnapshotCreateRefusals: every refusal of CreateFileSystemSnapshot, each with its
// code and reason, and no row left behind by a refusal before the runner was asked.
func TestSnapshotCreateRefusals(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	two, err := createWith(t, s, ctx, scratch("a", "", ""), scratch("b", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	none, err := createWith(t, s, ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = snapshotOf(t, s, ctx, "nope", "", "")
	wantReason(t, "unknown sandbox", err, connect.CodeNotFound, apierr.SandboxNotFound)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "", "")
	wantReason(t, "no volume named among several", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "c", "")
	wantReason(t, "a volume it does not have", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "scratch_volume_name" {
		t.Fatalf("violations %v", vs)
	}
	_, err = snapshotOf(t, s, ctx, none.GetSandboxId(), "", "")
	wantReason(t, "a sandbox without scratch volumes", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "b", string(make([]byte, MaxRequestIDBytes+1)))
	wantReason(t, "an overlong request_id", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	r.setState(two.GetSandboxId(), runner.StateCompleted)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "b", "")
	wantReason(t, "an ended sandbox", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning)
	r.setState(two.GetSandboxId(), runner.StateRunning)

	// The runner refuses: the row is FAILED with the runner's reason, the error returned.
	r.refuse = apierr.New(apierr.FSSSizeExceeded, "volume too large", nil)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "b", "refused-1")
	wantReason(t, "runner refusal", err, connect.CodeFailedPrecondition, apierr.FSSSizeExceeded)
	x, err := e.st.Snapshots().GetByRequestID(t.Context(), testOrg, "refused-1")
	if err != nil || x.State != store.SnapshotFailed || x.Reason != apierr.FSSSizeExceeded || x.StateReason != "volume too large" {
		t.Fatalf("refused row = %+v, %v", x, err)
	}
	// A runner that cannot be reached: the row stays CREATING for the runner to report.
	r.refuse = apierr.New(apierr.RunnerUnavailable, "gone", nil)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "b", "unreached-1")
	wantReason(t, "runner unreachable", err, connect.CodeUnavailable, apierr.RunnerUnavailable)
	if x, err := e.st.Snapshots().GetByRequestID(t.Context(), testOrg, "unreached-1"); err != nil || x.State != store.SnapshotCreating {
		t.Fatalf("unreached row = %+v, %v", x, err)
	}
	// "Not now": the request_id stays free for the client's retry, which takes it.
	r.refuse = apierr.New(apierr.FSSInflightLimit, "two in flight", nil)
	_, err = snapshotOf(t, s, ctx, two.GetSandboxId(), "b", "throttled-1")
	wantReason(t, "runner throttling", err, connect.CodeUnavailable, apierr.FSSInflightLimit)
	if _, err := e.st.Snapshots().GetByRequestID(t.Context(), testOrg, "throttled-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a throttled snapshot left a row: %v", err)
	}
	r.refuse = nil
	if x, err := snapshotOf(t, s, ctx, two.GetSandboxId(), "b", "throttled-1"); err != nil || x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("the retry after throttling: %v %v", x, err)
	}
	if n, _, _ := e.st.Snapshots().SnapshotUsage(t.Context(), testOrg); n != 2 {
		t.Fatalf("%d snapshots not FAILED recorded, want the unreached one and the retried one", n)
	}

	// A runner without snapshots, by its capacity or by its handle.
	nos := newSnapRunner("r2", e.blobs)
	nos.noSnapshots = true
	s2 := e.server(t, 0, nos)
	sb, err := createWith(t, s2, ctx, scratch("workspace", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	_, err = snapshotOf(t, s2, ctx, sb.GetSandboxId(), "", "")
	wantReason(t, "a runner reporting no snapshots", err, connect.CodeFailedPrecondition, apierr.FSSNotSupported)
	plain := &acceptingRunner{id: "r3"}
	s3 := e.server(t, 0, plain)
	sb3, err := createWith(t, s3, ctx, scratch("workspace", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	plain.mu.Lock()
	x3 := plain.got[sb3.GetSandboxId()]
	x3.State = runner.StateRunning
	plain.got[sb3.GetSandboxId()] = x3
	plain.mu.Unlock()
	_, err = snapshotOf(t, s3, ctx, sb3.GetSandboxId(), "", "")
	wantReason(t, "a handle that is no SnapshotHandle", err, connect.CodeFailedPrecondition, apierr.FSSNotSupported)

	// A gateway without a blob store.
	keys, _ := auth.OpenKeyring(filepath.Join(e.dir, "keys.json"))
	s4, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, Snapshots: e.st.Snapshots()})
	if err != nil {
		t.Fatal(err)
	}
	defer s4.Close()
	_, err = s4.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{}))
	wantReason(t, "no blob store", err, connect.CodeFailedPrecondition, apierr.FSSNotSupported)
}

// TestSnapshotIdempotency: the same request_id returns the same snapshot (also from a
// restarted gateway), never a second runner job; reused for another sandbox or volume it
// is a conflict.
func TestSnapshotIdempotency(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	sb, err := createWith(t, s, ctx, scratch("a", "", ""), scratch("b", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	first, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "a", "req-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "a", "req-1")
	if err != nil || again.GetFileSystemSnapshotId() != first.GetFileSystemSnapshotId() || again.GetRequestId() != "req-1" {
		t.Fatalf("replay = %v, %v; want %s", again, err, first.GetFileSystemSnapshotId())
	}
	s = e.server(t, 0, r) // restart
	again, err = snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "req-1")
	if err != nil || again.GetFileSystemSnapshotId() != first.GetFileSystemSnapshotId() {
		t.Fatalf("replay after restart = %v, %v", again, err)
	}
	if len(r.targets) != 1 {
		t.Fatalf("the runner was asked %d times, want once", len(r.targets))
	}
	_, err = snapshotOf(t, s, ctx, sb.GetSandboxId(), "b", "req-1")
	wantReason(t, "the request_id for another volume", err, connect.CodeInvalidArgument, apierr.RequestIDConflict)
	other, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "b", "req-2")
	if err != nil || other.GetFileSystemSnapshotId() == first.GetFileSystemSnapshotId() {
		t.Fatalf("another request_id: %v %v", other, err)
	}
	// Another organization's request_id space is its own.
	sbB, err := createWith(t, s, asOther(t.Context()), scratch("a", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if x, err := snapshotOf(t, s, asOther(t.Context()), sbB.GetSandboxId(), "", "req-1"); err != nil || x.GetFileSystemSnapshotId() == first.GetFileSystemSnapshotId() {
		t.Fatalf("the same request_id in another org: %v %v", x, err)
	}
}

// TestSnapshotListPages: newest first, organization-scoped, filtered by source sandbox,
// each snapshot once across pages of page_size; a garbage token or a negative size is
// INVALID_ARGUMENT.
func TestSnapshotListPages(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	a, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	b, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	var wantA []string
	for i := range 5 {
		src := a
		if i%2 == 1 {
			src = b
		}
		x, err := snapshotOf(t, s, ctx, src.GetSandboxId(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if src == a {
			wantA = append([]string{x.GetFileSystemSnapshotId()}, wantA...)
		}
		time.Sleep(2 * time.Millisecond) // distinct create times: newest first is checkable
	}
	list := func(req *sandboxv1.ListFileSystemSnapshotsRequest) []string {
		t.Helper()
		var out []string
		for range 10 {
			res, err := s.ListFileSystemSnapshots(ctx, connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res.Msg.GetFileSystemSnapshots() {
				out = append(out, x.GetFileSystemSnapshotId())
			}
			if res.Msg.GetNextPageToken() == "" {
				return out
			}
			req.PageToken = res.Msg.GetNextPageToken()
		}
		t.Fatal("too many pages")
		return nil
	}
	if got := list(&sandboxv1.ListFileSystemSnapshotsRequest{PageSize: 1, SourceSandboxId: a.GetSandboxId()}); !slices.Equal(got, wantA) {
		t.Fatalf("pages of a's snapshots = %v, want %v", got, wantA)
	}
	if got := list(&sandboxv1.ListFileSystemSnapshotsRequest{PageSize: 2}); len(got) != 5 {
		t.Fatalf("all = %v", got)
	}
	_, err := s.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{PageToken: "garbage!"}))
	wantReason(t, "garbage page token", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = s.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{PageSize: -1}))
	wantReason(t, "negative page size", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
}

// TestSnapshotDelete: CREATING cannot be deleted (FSS_NOT_READY); READY is answered
// DELETING and then gone with its archive; FAILED can be deleted; an unknown one is
// NOT_FOUND unless allow_missing; a crash after DELETING is finished by the reconciler
// of a restarted gateway.
func TestSnapshotDelete(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	sb, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	id := snap.GetFileSystemSnapshotId()
	del := func(id string, allowMissing bool) (*sandboxv1.FileSystemSnapshot, error) {
		res, err := s.DeleteFileSystemSnapshot(ctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{FileSystemSnapshotId: id, AllowMissing: allowMissing}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	_, err = del(id, false)
	wantReason(t, "delete while CREATING", err, connect.CodeFailedPrecondition, apierr.FSSNotReady)
	r.finish(t, id, []byte("archive"), 10)
	key := "fss/" + testOrg + "/" + id + ".tar.zst"
	got, err := del(id, false)
	if err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_DELETING || got.GetFileSystemSnapshotId() != id {
		t.Fatalf("delete READY = %v, %v", got, err)
	}
	if _, err := e.blobs.Stat(t.Context(), key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the archive is still there: %v", err)
	}
	_, err = getSnap(t, s, ctx, id)
	wantReason(t, "get after delete", err, connect.CodeNotFound, apierr.FSSNotFound)
	_, err = del(id, false)
	wantReason(t, "delete again", err, connect.CodeNotFound, apierr.FSSNotFound)
	if x, err := del(id, true); err != nil || x.GetFileSystemSnapshotId() != "" {
		t.Fatalf("delete again with allow_missing: %v %v", x, err)
	}
	_, err = del("", false)
	wantReason(t, "no id", err, connect.CodeInvalidArgument, apierr.InvalidRequest)

	// FAILED can be deleted too.
	failed, _ := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	r.fail(failed.GetFileSystemSnapshotId(), apierr.FSSCreateFailed, "disk error")
	if got, err := getSnap(t, s, ctx, failed.GetFileSystemSnapshotId()); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED ||
		got.GetStateReason() != apierr.FSSCreateFailed+": disk error" {
		t.Fatalf("failed = %v, %v", got, err)
	}
	if _, err := del(failed.GetFileSystemSnapshotId(), false); err != nil {
		t.Fatal(err)
	}

	// A crash between DELETING and the archive's removal: a new gateway finishes it.
	third, _ := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	r.finish(t, third.GetFileSystemSnapshotId(), []byte("three"), 5)
	if _, err := getSnap(t, s, ctx, third.GetFileSystemSnapshotId()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Snapshots().MarkDeleting(t.Context(), testOrg, third.GetFileSystemSnapshotId()); err != nil {
		t.Fatal(err)
	}
	s = e.server(t, 0, r)
	if got, err := getSnap(t, s, ctx, third.GetFileSystemSnapshotId()); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_DELETING {
		t.Fatalf("DELETING after the crash = %v, %v", got, err)
	}
	if _, n := s.ReconcileSnapshots(t.Context()); n != 1 {
		t.Fatalf("the reconciler removed %d snapshots, want 1", n)
	}
	if _, err := e.blobs.Stat(t.Context(), "fss/"+testOrg+"/"+third.GetFileSystemSnapshotId()+".tar.zst"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("the archive survived the reconciler: %v", err)
	}
	_, err = getSnap(t, s, ctx, third.GetFileSystemSnapshotId())
	wantReason(t, "get after the reconciler", err, connect.CodeNotFound, apierr.FSSNotFound)
}

// TestSnapshotReconcileAfterRestart: a CREATING snapshot is completed by the reconciler
// of a new gateway on the same store (nobody polls it); one whose runner is gone is
// FAILED "runner unavailable" only once the orphan grace has passed; an archive the
// runner reports but the blob store lacks fails the snapshot.
func TestSnapshotReconcileAfterRestart(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, time.Hour, r)
	ctx := asOrg(t.Context())
	sb, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	a, _ := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	b, _ := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	s.Close()
	r.finish(t, a.GetFileSystemSnapshotId(), []byte("a"), 1)
	// b: the runner claims it, but its object never arrived.
	r.finish(t, b.GetFileSystemSnapshotId(), []byte("b"), 1)
	if err := e.blobs.Delete(t.Context(), "fss/"+testOrg+"/"+b.GetFileSystemSnapshotId()+".tar.zst"); err != nil {
		t.Fatal(err)
	}
	s = e.server(t, time.Hour, r)
	if n, _ := s.ReconcileSnapshots(t.Context()); n != 2 {
		t.Fatalf("the reconciler completed %d, want 2", n)
	}
	x, _ := e.st.Snapshots().Get(t.Context(), testOrg, a.GetFileSystemSnapshotId())
	y, _ := e.st.Snapshots().Get(t.Context(), testOrg, b.GetFileSystemSnapshotId())
	if x.State != store.SnapshotReady || y.State != store.SnapshotFailed || y.Reason != apierr.FSSCreateFailed {
		t.Fatalf("after reconcile: a %s, b %s %s", x.State, y.State, y.Reason)
	}

	// The runner goes away for good: within the grace nothing happens, past it FAILED.
	c, _ := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	gone := &acceptingRunner{id: "r1"} // same id, takes no snapshots any more
	s = e.server(t, time.Hour, gone)
	if n, _ := s.ReconcileSnapshots(t.Context()); n != 0 {
		t.Fatalf("within the grace the reconciler completed %d", n)
	}
	s = e.server(t, 50*time.Millisecond, gone)
	if n, _ := s.ReconcileSnapshots(t.Context()); n != 0 { // first seen unreachable now
		t.Fatalf("when the runner was first seen unreachable the reconciler completed %d", n)
	}
	time.Sleep(60 * time.Millisecond)
	if n, _ := s.ReconcileSnapshots(t.Context()); n != 1 {
		t.Fatalf("past the grace the reconciler completed %d, want 1", n)
	}
	got, err := getSnap(t, s, ctx, c.GetFileSystemSnapshotId())
	if err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED || !bytes.Contains([]byte(got.GetStateReason()), []byte("runner unavailable")) {
		t.Fatalf("snapshot of a gone runner = %v, %v", got, err)
	}
}

// TestDeleteSandboxSnapshotVolumes: DeleteSandbox with snapshot_volumes records one
// ON_DELETE snapshot per volume, in order, hands them to the runner's delete, and
// returns their ids; the same request_id returns the same ids without deleting again;
// refusals: allow_missing with snapshot_volumes, a volume it does not have, an ended
// sandbox, a runner that takes none; a runner failing the snapshots still deletes the
// sandbox.
func TestDeleteSandboxSnapshotVolumes(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, r)
	ctx := asOrg(t.Context())
	sb, _ := createWith(t, s, ctx, scratch("a", "", ""), scratch("workspace", "", ""))
	del := func(req *sandboxv1.DeleteSandboxRequest) (*sandboxv1.DeleteSandboxResponse, error) {
		res, err := s.DeleteSandbox(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	_, err := del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId(), SnapshotVolumes: []string{"a"}, AllowMissing: true})
	wantReason(t, "allow_missing with snapshot_volumes", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	_, err = del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId(), SnapshotVolumes: []string{"a", "nope"}})
	wantReason(t, "a volume it does not have", err, connect.CodeInvalidArgument, apierr.VolumeNotSnapshottable)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "snapshot_volumes[1]" {
		t.Fatalf("violations %v", vs)
	}

	out, err := del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId(), SnapshotVolumes: []string{"workspace", "a"}, RequestId: "stop-1", GracePeriodSeconds: 10})
	if err != nil {
		t.Fatal(err)
	}
	ids := out.GetFileSystemSnapshotIds()
	if len(ids) != 2 || out.GetSandbox().GetStatus().GetState() != sandboxv1.State_STATE_TERMINATING {
		t.Fatalf("delete = %v", out)
	}
	if len(r.targets) != 2 || r.targets[0].Volume != "workspace" || r.targets[0].SnapshotID != ids[0] || r.targets[1].Volume != "a" || r.targets[1].SnapshotID != ids[1] {
		t.Fatalf("the runner got %+v", r.targets)
	}
	for i, vol := range []string{"workspace", "a"} {
		x, err := getSnap(t, s, ctx, ids[i])
		if err != nil || x.GetTrigger() != sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE || x.GetSourceVolumeName() != vol ||
			x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING || x.GetRequestId() != "stop-1" {
			t.Fatalf("snapshot %d = %v, %v", i, x, err)
		}
	}
	// A replay returns the same ids, and neither asks the runner nor deletes again.
	again, err := del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId(), SnapshotVolumes: []string{"workspace", "a"}, RequestId: "stop-1"})
	if err != nil || !slices.Equal(again.GetFileSystemSnapshotIds(), ids) || len(r.targets) != 2 || r.deletes != 0 {
		t.Fatalf("replay = %v, %v (runner targets %d, deletes %d)", again, err, len(r.targets), r.deletes)
	}
	// Without request_id, a sandbox on its way out is refused.
	_, err = del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb.GetSandboxId(), SnapshotVolumes: []string{"a"}})
	wantReason(t, "a terminating sandbox", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning)
	r.finish(t, ids[0], []byte("ws"), 2)
	if x, err := getSnap(t, s, ctx, ids[0]); err != nil || x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY {
		t.Fatalf("snapshot on delete once done = %v, %v", x, err)
	}

	// The runner fails the snapshots: the sandbox is deleted anyway, the snapshots FAILED.
	sb2, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	r.refuse = apierr.New(apierr.FSSBucketUnavailable, "bucket down", nil)
	out, err = del(&sandboxv1.DeleteSandboxRequest{SandboxId: sb2.GetSandboxId(), SnapshotVolumes: []string{"workspace"}})
	r.refuse = nil
	if err != nil || len(out.GetFileSystemSnapshotIds()) != 1 || out.GetSandbox().GetStatus().GetState() != sandboxv1.State_STATE_TERMINATED || r.deletes != 1 {
		t.Fatalf("delete with failing snapshots = %v, %v (deletes %d)", out, err, r.deletes)
	}
	if x, err := getSnap(t, s, ctx, out.GetFileSystemSnapshotIds()[0]); err != nil || x.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED {
		t.Fatalf("its snapshot = %v, %v", x, err)
	}

	// A runner without snapshots refuses before deleting anything.
	nos := &acceptingRunner{id: "r2"}
	s2 := e.server(t, 0, nos)
	sb3, _ := createWith(t, s2, ctx, scratch("workspace", "", ""))
	_, err = s2.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sb3.GetSandboxId(), SnapshotVolumes: []string{"workspace"}}))
	wantReason(t, "a runner without snapshots", err, connect.CodeFailedPrecondition, apierr.FSSNotSupported)
}

// TestRestoreRefusalsAndPlacement: a restore from a snapshot that is not READY is
// FSS_NOT_READY; a restoring sandbox is placed only on a runner that takes snapshots,
// and the preference hook sees its snapshot.
func TestRestoreRefusalsAndPlacement(t *testing.T) {
	e := newSnapEnv(t)
	nos := newSnapRunner("nos", e.blobs)
	nos.noSnapshots = true
	r := newSnapRunner("r1", e.blobs)
	s := e.server(t, 0, nos, r)
	ctx := asOrg(t.Context())
	var sb *sandboxv1.Sandbox
	for sb == nil || sb.GetStatus().GetRunnerId() != "r1" {
		var err error
		if sb, err = createWith(t, s, ctx, scratch("workspace", "", "")); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = createWith(t, s, ctx, scratch("workspace", "", snap.GetFileSystemSnapshotId()))
	wantReason(t, "restore from a CREATING snapshot", err, connect.CodeFailedPrecondition, apierr.FSSNotReady)
	r.finish(t, snap.GetFileSystemSnapshotId(), []byte("x"), 1)
	var seen []string
	s.hooks.prefer = func(_ context.Context, cands []placement.Candidate, srcs []runner.SnapshotSource) []placement.Candidate {
		for _, src := range srcs {
			seen = append(seen, src.SnapshotID)
		}
		return cands
	}
	for i := range 6 {
		x, err := createWith(t, s, ctx, scratch("workspace", "", snap.GetFileSystemSnapshotId()))
		if err != nil {
			t.Fatal(err)
		}
		if x.GetStatus().GetRunnerId() != "r1" {
			t.Fatalf("restore %d placed on %s, a runner without snapshots", i, x.GetStatus().GetRunnerId())
		}
	}
	if len(seen) != 6 || seen[0] != snap.GetFileSystemSnapshotId() {
		t.Fatalf("the preference hook saw %v", seen)
	}
	// Only the runner without snapshots: no suitable runner.
	s2 := e.server(t, 0, nos)
	_, err = createWith(t, s2, ctx, scratch("workspace", "", snap.GetFileSystemSnapshotId()))
	if apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("restore with only a runner without snapshots: %v (%s)", err, apierr.Reason(err))
	}
}

// TestSnapshotLimitsThroughTheRPCs: the limits (fsslimits.go) apply to the RPCs as wired in
// New: a third snapshot of a sandbox with two in flight is UNAVAILABLE
// CWSANDBOX_FSS_INFLIGHT_LIMIT, and an organization at its count quota gets
// RESOURCE_EXHAUSTED CWSANDBOX_FSS_QUOTA_EXCEEDED, also for DeleteSandbox snapshot_volumes.
func TestSnapshotLimitsThroughTheRPCs(t *testing.T) {
	e := newSnapEnv(t)
	r := newSnapRunner("r1", e.blobs)
	s := e.serverWith(t, 0, SnapshotLimits{MaxInFlightPerSandbox: 2, MaxPerOrg: 3}, r)
	ctx := asOrg(t.Context())
	a, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	for range 2 {
		if _, err := snapshotOf(t, s, ctx, a.GetSandboxId(), "", ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err := snapshotOf(t, s, ctx, a.GetSandboxId(), "", "")
	wantReason(t, "third in flight", err, connect.CodeUnavailable, apierr.FSSInflightLimit)
	b, _ := createWith(t, s, ctx, scratch("workspace", "", ""))
	if _, err := snapshotOf(t, s, ctx, b.GetSandboxId(), "", ""); err != nil {
		t.Fatal(err)
	}
	_, err = snapshotOf(t, s, ctx, b.GetSandboxId(), "", "")
	wantReason(t, "fourth of the organization", err, connect.CodeResourceExhausted, apierr.FSSQuotaExceeded)
	_, err = s.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: b.GetSandboxId(), SnapshotVolumes: []string{"workspace"}}))
	wantReason(t, "on delete over the quota", err, connect.CodeResourceExhausted, apierr.FSSQuotaExceeded)
}

// TestSnapshotListRefreshes: a list asks the runner about the CREATING snapshots it shows,
// so a snapshot the runner has finished is READY in the list at once (no Get first, no
// wait for the reconciler); with no runner answering, it stays CREATING as stored.
func TestSnapshotListRefreshes(t *testing.T) {
	s, r, ctx, sb := newSnapSandbox(t)
	var ids []string
	for range 2 {
		snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, snap.GetFileSystemSnapshotId())
	}
	r.finish(t, ids[0], []byte("an archive"), 1<<20)
	l, err := s.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]sandboxv1.SnapshotState{}
	for _, x := range l.Msg.GetFileSystemSnapshots() {
		states[x.GetFileSystemSnapshotId()] = x.GetState()
	}
	if states[ids[0]] != sandboxv1.SnapshotState_SNAPSHOT_STATE_READY || states[ids[1]] != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("list states %v: want %s READY (finished) and %s CREATING", states, ids[0], ids[1])
	}
}

// TestSnapshotUnknownJobYoung: a runner that does not know a snapshot's job (its create
// has written the row but not yet registered the job) leaves a young snapshot CREATING,
// for a list, a get and the reconciler alike: failing it would leave its archive, once
// uploaded, counted nowhere. Past the grace the job is lost and the snapshot FAILED.
func TestSnapshotUnknownJobYoung(t *testing.T) {
	t.Run("unknown", func(t *testing.T) { testSnapshotUnknownJobYoung(t, false) })
	// A runner of an earlier release: FAILED with no completion time, no Unknown.
	t.Run("legacy", func(t *testing.T) { testSnapshotUnknownJobYoung(t, true) })
}

func testSnapshotUnknownJobYoung(t *testing.T, legacy bool) {
	s, r, ctx, sb := newSnapSandbox(t)
	r.smu.Lock()
	r.legacyUnknown = legacy
	r.smu.Unlock()
	snap, err := snapshotOf(t, s, ctx, sb.GetSandboxId(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	id := snap.GetFileSystemSnapshotId()
	r.smu.Lock()
	delete(r.jobs, id) // as if the runner had not registered it yet
	r.smu.Unlock()
	l, err := s.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{}))
	if err != nil || len(l.Msg.GetFileSystemSnapshots()) != 1 || l.Msg.GetFileSystemSnapshots()[0].GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("list of a young snapshot the runner does not know: %v %v, want CREATING", l, err)
	}
	s.ReconcileSnapshots(t.Context())
	if got, err := getSnap(t, s, ctx, id); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING {
		t.Fatalf("get after a reconcile: %v %v, want CREATING", got, err)
	}
	old := unknownJobGrace
	unknownJobGrace = 0
	defer func() { unknownJobGrace = old }()
	if got, err := getSnap(t, s, ctx, id); err != nil || got.GetState() != sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED {
		t.Fatalf("get past the grace: %v %v, want FAILED", got, err)
	}
}
