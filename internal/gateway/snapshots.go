package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
)

// File-system snapshots (issue 20). The gateway keeps the index (SnapshotStore: one row
// per snapshot, organization-scoped, all state in the store so that any replica and a
// restarted gateway carry on); the runner that owns the source sandbox captures the
// volume and uploads the archive to the blob store under the key the gateway chose
// (snapshotKey); the gateway records the outcome when a caller asks (Get) or the
// reconciler polls (ReconcileSnapshots), and removes the archive on delete.
//
// Lifecycle of a row: CREATING (inserted before the runner is asked) → READY | FAILED
// (the runner's job outcome, or FAILED when the runner stays unreachable past the orphan
// grace) → DELETING (DeleteFileSystemSnapshot) → gone (its object deleted, then the row).
// A crash between any two steps leaves a row the reconciler finishes.

// SnapshotStore is where the gateway keeps its snapshot index.
type SnapshotStore interface {
	store.Snapshots
}

// DefaultScratchVolumeName is the official client's scratch volume
// (DEFAULT_SCRATCH_VOLUME_NAME): the one a snapshot without scratch_volume_name takes
// when a sandbox has several.
const DefaultScratchVolumeName = "workspace"

// onDeletePrefix marks the request_id of a snapshot taken on delete: the DeleteSandbox
// request_id, per volume (several snapshots share the one request).
const onDeletePrefix = "ondelete/"

// snapshotHooks are what the snapshot limits and placement preference plug into
// (quotas.go and friends set them in New); nil members do nothing.
type snapshotHooks struct {
	// admit is asked before n snapshots of sandboxID are recorded for org: an error
	// (CWSANDBOX_FSS_QUOTA_EXCEEDED, FSS_INFLIGHT_LIMIT …) refuses them; maxSize bounds
	// each archive (0 = no bound).
	// onDelete: they are DeleteSandbox's snapshot_volumes (no in-flight limit: the
	// sandbox is going away).
	admit func(ctx context.Context, org, sandboxID string, n int, onDelete bool) (maxSize int64, err error)
	// prefer reorders placement's candidates (best first) for a sandbox restoring srcs,
	// e.g. runners that have the archives cached first.
	prefer func(ctx context.Context, cands []placement.Candidate, srcs []runner.SnapshotSource) []placement.Candidate
}

// unreachable remembers since when each runner's snapshot jobs could not be asked about.
type unreachable struct {
	mu    sync.Mutex
	since map[string]time.Time
}

func (u *unreachable) mark(runnerID string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.since == nil {
		u.since = map[string]time.Time{}
	}
	t, ok := u.since[runnerID]
	if !ok {
		t = time.Now()
		u.since[runnerID] = t
	}
	return t
}

func (u *unreachable) clear(runnerID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.since, runnerID)
}

func (s *Server) snapshotsOff() error {
	if s.snaps == nil || s.blobs == nil {
		return apierr.Newf(apierr.FSSNotSupported, "file-system snapshots are not enabled on this sandboxd: the gateway has no snapshot index or blob store")
	}
	return nil
}

// storeFor is the store of a snapshot's object_bucket: the platform's ("" too), or an
// organization's own, reached with the platform store's endpoint and credentials.
func (s *Server) storeFor(ctx context.Context, bucket string) (blob.Store, error) {
	if bucket == "" || bucket == s.snapBucket {
		return s.blobs, nil
	}
	return s.openBucket(ctx, bucket)
}

// runnerBucket is a snapshot's object_bucket as a runner is told it
// (SnapshotTarget.Bucket, SnapshotSource.Bucket): "" for the platform's.
func (s *Server) runnerBucket(bucket string) string {
	if bucket == s.snapBucket {
		return ""
	}
	return bucket
}

// bucketGone: err says a bucket does not exist, or cannot exist for this deployment (its
// blob store is not S3).
func bucketGone(err error) bool {
	return errors.Is(err, s3.ErrNoSuchBucket) || errors.Is(err, blobconfig.ErrNoOtherBucket)
}

// newSnapshotID names a snapshot as sandboxes are named.
func newSnapshotID() string { return runner.NewID() }

// snapshotKey is the blob key of a snapshot's archive: fss/<organization>/<id>.tar.zst. An
// organization ID that is not a valid key component is replaced by a digest of it.
func snapshotKey(org, id string) string {
	return "fss/" + orgKeyComponent(org) + "/" + id + ".tar.zst"
}

// orgKeyComponent is org as one blob key component: itself, or a digest of it when it is
// not a valid one.
func orgKeyComponent(org string) string {
	if strings.Contains(org, "/") || blob.ValidateKey(org) != nil {
		sum := sha256.Sum256([]byte(org))
		return "org-" + hex.EncodeToString(sum[:16])
	}
	return org
}

func snapshotNotFound(id string) error {
	return apierr.New(apierr.FSSNotFound, fmt.Sprintf("file-system snapshot %q not found", id), map[string]string{"file_system_snapshot_id": id})
}

func storeUnavailable(err error) error {
	return apierr.WithRetry(apierr.New(apierr.BackendUnavailable, "the snapshot index cannot answer now: "+err.Error(), nil), 2*time.Second)
}

func snapshotState(st string) sandboxv1.SnapshotState {
	switch st {
	case store.SnapshotCreating:
		return sandboxv1.SnapshotState_SNAPSHOT_STATE_CREATING
	case store.SnapshotReady:
		return sandboxv1.SnapshotState_SNAPSHOT_STATE_READY
	case store.SnapshotFailed:
		return sandboxv1.SnapshotState_SNAPSHOT_STATE_FAILED
	case store.SnapshotDeleting:
		return sandboxv1.SnapshotState_SNAPSHOT_STATE_DELETING
	}
	return sandboxv1.SnapshotState_SNAPSHOT_STATE_UNSPECIFIED
}

// snapshotProto is the public form of a snapshot.
func snapshotProto(x store.Snapshot) *sandboxv1.FileSystemSnapshot {
	p := &sandboxv1.FileSystemSnapshot{
		FileSystemSnapshotId: x.ID,
		State:                snapshotState(x.State),
		StateReason:          x.StateReason,
		SizeBytes:            x.SizeBytes,
		SourceSandboxId:      x.SourceSandboxID,
		Trigger:              sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_MANUAL,
		CreateTime:           ts(x.CreateTime),
		SourceVolumeName:     x.SourceVolumeName,
		ObjectBucket:         x.ObjectBucket,
		UpdatedAt:            ts(x.UpdatedAt),
		RequestId:            x.RequestID,
	}
	if x.Reason != "" {
		p.StateReason = x.Reason
		if x.StateReason != "" {
			p.StateReason += ": " + x.StateReason
		}
	}
	if x.CompleteTime != nil {
		p.CompleteTime = ts(*x.CompleteTime)
	}
	if x.Trigger == store.TriggerOnDelete {
		p.Trigger = sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE
		// The DeleteSandbox request's own request_id.
		if rest, ok := strings.CutPrefix(x.RequestID, onDeletePrefix); ok {
			if _, rid, ok := strings.Cut(rest, "/"); ok {
				p.RequestId = rid
			}
		}
	}
	return p
}

// scratchVolumeOf is the scratch volume of sp a snapshot takes: name, or when name is
// empty the sandbox's only scratch volume (or DefaultScratchVolumeName among several).
func scratchVolumeOf(sandboxID string, sp *sandboxv1.SandboxSpec, name, field string) (string, error) {
	var scratch []string
	for _, v := range sp.GetVolumes() {
		if v.GetVolumeId() == "" {
			scratch = append(scratch, v.GetName())
		}
	}
	if name == "" {
		switch {
		case len(scratch) == 1:
			return scratch[0], nil
		case slices.Contains(scratch, DefaultScratchVolumeName):
			return DefaultScratchVolumeName, nil
		case len(scratch) == 0:
			vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("sandbox %s has no scratch volume to snapshot; start it with one", sandboxID)}}
			return "", apierr.Invalid(apierr.InvalidRequest, "nothing to snapshot: "+apierr.Describe(vs), vs)
		}
		vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("sandbox %s has scratch volumes %s: name one", sandboxID, strings.Join(scratch, ", "))}}
		return "", apierr.Invalid(apierr.InvalidRequest, "which volume? "+apierr.Describe(vs), vs)
	}
	for _, v := range sp.GetVolumes() {
		if v.GetName() != name {
			continue
		}
		if v.GetVolumeId() != "" {
			vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("volume %q of sandbox %s is a registered volume, not a scratch volume", name, sandboxID)}}
			return "", apierr.Invalid(apierr.VolumeNotSnapshottable, "volume not snapshottable: "+apierr.Describe(vs), vs)
		}
		return name, nil
	}
	vs := []apierr.Violation{{Field: field, Description: fmt.Sprintf("sandbox %s has no volume named %q (its scratch volumes: %s)", sandboxID, name, strings.Join(scratch, ", "))}}
	return "", apierr.Invalid(apierr.InvalidRequest, "no such volume: "+apierr.Describe(vs), vs)
}

// snapshotHandle is r as a runner that takes snapshots, or CWSANDBOX_FSS_NOT_SUPPORTED.
func (s *Server) snapshotHandle(ctx context.Context, r runner.Handle) (runner.SnapshotHandle, error) {
	sh, ok := r.(runner.SnapshotHandle)
	if ok {
		for i, h := range s.runners {
			if h.ID() == r.ID() {
				if v := s.views.runner(ctx, i); v.connected && v.capacity.NoSnapshots {
					ok = false
				}
			}
		}
	}
	if !ok {
		return nil, apierr.New(apierr.FSSNotSupported, fmt.Sprintf("runner %s takes no file-system snapshots", r.ID()), map[string]string{"runner_id": r.ID()})
	}
	return sh, nil
}

func (s *Server) admitSnapshots(ctx context.Context, org, sandboxID string, n int, onDelete bool) (int64, error) {
	if s.hooks.admit == nil {
		return 0, nil
	}
	return s.hooks.admit(ctx, org, sandboxID, n, onDelete)
}

func snapshotRequestIDConflict(field string) error {
	vs := []apierr.Violation{{Field: field, Description: "already took a snapshot of another sandbox or volume"}}
	return apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(vs), vs)
}

func (s *Server) CreateFileSystemSnapshot(ctx context.Context, req *connect.Request[sandboxv1.CreateFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	m := req.Msg
	if err := s.snapshotsOff(); err != nil {
		return nil, err
	}
	if vs := requestIDViolations("request_id", m.GetRequestId()); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	org := principal(ctx).Org
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	replay := func(x store.Snapshot) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
		if x.Trigger != store.TriggerManual || x.SourceSandboxID != rec.id ||
			(m.GetScratchVolumeName() != "" && m.GetScratchVolumeName() != x.SourceVolumeName) {
			return nil, snapshotRequestIDConflict("request_id")
		}
		x, _ = s.refreshSnapshot(ctx, x)
		return connect.NewResponse(snapshotProto(x)), nil
	}
	if rid := m.GetRequestId(); rid != "" {
		x, err := s.snaps.GetByRequestID(ctx, org, rid)
		switch {
		case err == nil:
			return replay(x)
		case !errors.Is(err, store.ErrNotFound):
			return nil, storeUnavailable(err)
		}
	}
	vol, err := scratchVolumeOf(rec.id, rec.spec, m.GetScratchVolumeName(), "scratch_volume_name")
	if err != nil {
		return nil, err
	}
	sh, err := s.snapshotHandle(ctx, r)
	if err != nil {
		return nil, err
	}
	if sb := s.current(ctx, rec, r); sb.State != runner.StateRunning {
		return nil, apierr.New(apierr.SandboxNotRunning, fmt.Sprintf("sandbox %s is %s: only a RUNNING sandbox is snapshotted (DeleteSandbox snapshot_volumes snapshots one on its way out)", rec.id, sb.State),
			map[string]string{"sandbox_id": rec.id})
	}
	maxSize, err := s.admitSnapshots(ctx, org, rec.id, 1, false)
	if err != nil {
		return nil, err
	}
	bucket, err := s.snapshotBucketFor(ctx, org)
	if err != nil {
		return nil, err
	}
	id := newSnapshotID()
	x, created, err := s.snaps.Create(ctx, store.Snapshot{ID: id, Org: org, State: store.SnapshotCreating,
		SourceSandboxID: rec.id, SourceVolumeName: vol, Trigger: store.TriggerManual, ObjectBucket: bucket,
		ObjectKey: snapshotKey(org, id), RunnerID: r.ID(), RequestID: m.GetRequestId()})
	if err != nil {
		return nil, storeUnavailable(err)
	}
	if !created { // the same request_id, meanwhile on another replica
		return replay(x)
	}
	job, err := sh.SnapshotVolume(ctx, rec.id, runner.SnapshotTarget{Volume: vol, SnapshotID: x.ID, BlobKey: x.ObjectKey, MaxSizeBytes: maxSize, Bucket: s.runnerBucket(x.ObjectBucket)})
	if err != nil {
		aerr := runner.APIError(rec.id, err, runner.SpecField)
		switch code := connect.CodeOf(aerr); {
		case code == connect.CodeUnavailable && apierr.IsSnapshotReason(apierr.Reason(aerr)):
			// "Not now" (throttled, in-flight limit, bucket unreachable): the runner took
			// nothing, and the client retries with the same request_id, which must then
			// take the snapshot rather than find this one FAILED.
			s.dropSnapshot(ctx, s.failSnapshot(ctx, x, aerr))
		case code == connect.CodeUnavailable || code == connect.CodeDeadlineExceeded || code == connect.CodeCanceled:
			// The runner may have started it: the row stays CREATING, and the next Get or
			// the reconciler asks the runner (which reports a job it never had as FAILED).
			s.log.Warn("snapshot: runner did not answer", "snapshot", x.ID, "sandbox", rec.id, "runner", r.ID(), "err", err)
		default:
			s.failSnapshot(ctx, x, aerr)
		}
		return nil, aerr
	}
	x = s.applyJob(ctx, x, job)
	s.log.Info("snapshot started", "snapshot", x.ID, "org", org, "sandbox", rec.id, "volume", vol, "runner", r.ID())
	return connect.NewResponse(snapshotProto(x)), nil
}

// failSnapshot records a CREATING snapshot FAILED with the reason of err (an API error).
func (s *Server) failSnapshot(ctx context.Context, x store.Snapshot, err error) store.Snapshot {
	reason := apierr.Reason(err)
	if !apierr.IsSnapshotReason(reason) {
		reason = apierr.FSSCreateFailed
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	return s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotFailed, Reason: reason, StateReason: msg})
}

// dropSnapshot removes the row of a FAILED snapshot that has no archive (the runner
// refused it), freeing its request_id.
func (s *Server) dropSnapshot(ctx context.Context, x store.Snapshot) {
	ctx = context.WithoutCancel(ctx)
	if _, err := s.snaps.MarkDeleting(ctx, x.Org, x.ID); err != nil {
		s.log.Warn("snapshot: drop refused snapshot", "snapshot", x.ID, "err", err)
		return
	}
	s.finishDelete(ctx, x)
}

// complete records c for CREATING x; a snapshot completed meanwhile (by another replica)
// is read back.
func (s *Server) complete(ctx context.Context, x store.Snapshot, c store.SnapshotCompletion) store.Snapshot {
	ctx = context.WithoutCancel(ctx)
	y, err := s.snaps.Complete(ctx, x.Org, x.ID, c)
	if err == nil {
		s.log.Info("snapshot completed", "snapshot", x.ID, "org", x.Org, "state", y.State, "reason", y.Reason, "size", y.SizeBytes, "pause", y.Pause)
		return y
	}
	if errors.Is(err, store.ErrConflict) {
		if y, err := s.snaps.Get(ctx, x.Org, x.ID); err == nil {
			return y
		}
	}
	s.log.Warn("record snapshot outcome", "snapshot", x.ID, "err", err)
	return x
}

// applyJob records what the runner reports of CREATING snapshot x. A READY archive is
// checked against the blob store first: an object missing or of another size or digest
// than the runner reported fails the snapshot; a store that cannot answer leaves it
// CREATING for the next look.
func (s *Server) applyJob(ctx context.Context, x store.Snapshot, job runner.SnapshotJob) store.Snapshot {
	if x.State != store.SnapshotCreating {
		return x
	}
	switch job.State {
	case runner.SnapshotReady:
		var info blob.Info
		st, err := s.storeFor(ctx, x.ObjectBucket)
		if err == nil {
			info, err = st.Stat(ctx, x.ObjectKey)
		}
		switch {
		case errors.Is(err, blob.ErrNotFound), bucketGone(err):
			return s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotFailed, Reason: apierr.FSSCreateFailed,
				StateReason: "the runner reported the archive uploaded, but bucket " + x.ObjectBucket + " has no object " + x.ObjectKey, Pause: job.Pause})
		case err != nil:
			s.log.Warn("snapshot: stat archive", "snapshot", x.ID, "key", x.ObjectKey, "err", err)
			return x
		case info.Size != job.SizeBytes || (job.Digest != "" && info.SHA256 != "" && info.SHA256 != job.Digest):
			return s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotFailed, Reason: apierr.FSSCreateFailed,
				StateReason: fmt.Sprintf("the archive in the blob store (%d bytes, sha256 %s) is not what the runner uploaded (%d bytes, sha256 %s)",
					info.Size, info.SHA256, job.SizeBytes, job.Digest), Pause: job.Pause})
		}
		digest := job.Digest
		if digest == "" {
			digest = info.SHA256
		}
		return s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotReady, SizeBytes: info.Size, ContentBytes: job.ContentBytes,
			Digest: digest, Pause: job.Pause, CompleteTime: job.CompleteTime})
	case runner.SnapshotFailed:
		if (job.Unknown || job.CompleteTime.IsZero()) && time.Since(x.CreateTime) < unknownJobGrace {
			// The runner does not know the job: for a young row, that is a create whose
			// runner call has not registered it yet (the row is written first). Failing
			// it now would leave its archive uploaded, uncounted. A runner of an earlier
			// release says so only by a FAILED job with no completion time (every job it
			// ran has one): the gateway reads both while runners roll to this release. (A
			// job state this side does not know converts the same way, jobFromProto: it
			// too waits out the grace, then fails.)
			return x
		}
		reason := job.Reason
		if !apierr.Known(reason) {
			reason = apierr.FSSCreateFailed
		}
		return s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotFailed, Reason: reason, StateReason: job.Message,
			Pause: job.Pause, CompleteTime: job.CompleteTime})
	}
	return x
}

// unknownJobGrace is how long a CREATING snapshot whose runner does not know its job
// stays CREATING: its create may still be registering the job (applyJob). Past it, the
// job is lost (a runner restarted before it started) and the snapshot FAILED.
var unknownJobGrace = time.Minute // a var for a test

// refreshSnapshot asks the owning runner about CREATING x and records its outcome; it
// reports whether the runner answered (true for x in another state).
func (s *Server) refreshSnapshot(ctx context.Context, x store.Snapshot) (store.Snapshot, bool) {
	if x.State != store.SnapshotCreating {
		return x, true
	}
	sh, ok := s.runnerByID(x.RunnerID).(runner.SnapshotHandle)
	if !ok {
		return x, false
	}
	ctx, cancel := context.WithTimeout(ctx, viewTimeout)
	defer cancel()
	job, err := sh.GetSnapshotJob(ctx, x.ID)
	if err != nil {
		s.log.Debug("snapshot: ask runner", "snapshot", x.ID, "runner", x.RunnerID, "err", err)
		return x, false
	}
	return s.applyJob(ctx, x, job), true
}

func requireSnapshotID(id string) error {
	if id == "" {
		vs := []apierr.Violation{{Field: "file_system_snapshot_id", Description: "is required"}}
		return apierr.Invalid(apierr.InvalidRequest, "file_system_snapshot_id is required", vs)
	}
	if len(id) > spec.MaxSnapshotIDBytes { // no snapshot has such an id: not worth a lookup
		return snapshotNotFound(id[:spec.MaxSnapshotIDBytes] + "…")
	}
	return nil
}

// getSnapshot reads the caller's snapshot id: another organization's is FSS_NOT_FOUND.
func (s *Server) getSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	if err := requireSnapshotID(id); err != nil {
		return store.Snapshot{}, err
	}
	x, err := s.snaps.Get(ctx, principal(ctx).Org, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Snapshot{}, snapshotNotFound(id)
	case err != nil:
		return store.Snapshot{}, storeUnavailable(err)
	}
	return x, nil
}

func (s *Server) GetFileSystemSnapshot(ctx context.Context, req *connect.Request[sandboxv1.GetFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	if err := s.snapshotsOff(); err != nil {
		return nil, err
	}
	x, err := s.getSnapshot(ctx, req.Msg.GetFileSystemSnapshotId())
	if err != nil {
		return nil, err
	}
	x, _ = s.refreshSnapshot(ctx, x)
	return connect.NewResponse(snapshotProto(x)), nil
}

func (s *Server) ListFileSystemSnapshots(ctx context.Context, req *connect.Request[sandboxv1.ListFileSystemSnapshotsRequest]) (*connect.Response[sandboxv1.ListFileSystemSnapshotsResponse], error) {
	if err := s.snapshotsOff(); err != nil {
		return nil, err
	}
	m := req.Msg
	size, err := apierr.PageSize(m.GetPageSize(), defaultPageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	if len(m.GetSourceSandboxId()) > MaxRequestIDBytes {
		vs := []apierr.Violation{{Field: "source_sandbox_id", Description: fmt.Sprintf("is %d bytes, no sandbox ID is longer than %d", len(m.GetSourceSandboxId()), MaxRequestIDBytes)}}
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid source_sandbox_id: "+apierr.Describe(vs), vs)
	}
	xs, next, err := s.snaps.List(ctx, principal(ctx).Org, store.SnapshotFilter{SourceSandboxID: m.GetSourceSandboxId()},
		store.Page{Size: size, Token: m.GetPageToken()})
	switch {
	case errors.Is(err, store.ErrInvalid):
		return nil, badPageToken()
	case err != nil:
		return nil, storeUnavailable(err)
	}
	s.refreshCreating(ctx, xs)
	out := &sandboxv1.ListFileSystemSnapshotsResponse{NextPageToken: next}
	for _, x := range xs {
		out.FileSystemSnapshots = append(out.FileSystemSnapshots, snapshotProto(x))
	}
	return connect.NewResponse(out), nil
}

// maxListRefreshes bounds the CREATING snapshots one list asks their runners about.
const maxListRefreshes = 16

// refreshCreating asks the runners of the first maxListRefreshes CREATING snapshots of xs
// about them, at once, and puts what they answer in xs: a list shows a snapshot READY as
// soon as a Get would, not when the reconciler next passes. Others stay as stored.
func (s *Server) refreshCreating(ctx context.Context, xs []store.Snapshot) {
	var wg sync.WaitGroup
	n := 0
	for i := range xs {
		if xs[i].State != store.SnapshotCreating || n == maxListRefreshes {
			continue
		}
		n++
		wg.Go(func() { xs[i], _ = s.refreshSnapshot(ctx, xs[i]) })
	}
	wg.Wait()
}

func (s *Server) DeleteFileSystemSnapshot(ctx context.Context, req *connect.Request[sandboxv1.DeleteFileSystemSnapshotRequest]) (*connect.Response[sandboxv1.FileSystemSnapshot], error) {
	if err := s.snapshotsOff(); err != nil {
		return nil, err
	}
	x, err := s.getSnapshot(ctx, req.Msg.GetFileSystemSnapshotId())
	if err != nil {
		if req.Msg.GetAllowMissing() && apierr.Reason(err) == apierr.FSSNotFound {
			return connect.NewResponse(&sandboxv1.FileSystemSnapshot{}), nil
		}
		return nil, err
	}
	if x.State == store.SnapshotCreating {
		if x, _ = s.refreshSnapshot(ctx, x); x.State == store.SnapshotCreating {
			return nil, apierr.New(apierr.FSSNotReady, fmt.Sprintf("file-system snapshot %s is still CREATING: delete it once READY or FAILED", x.ID),
				map[string]string{"file_system_snapshot_id": x.ID})
		}
	}
	y, err := s.snaps.MarkDeleting(ctx, x.Org, x.ID)
	switch {
	case errors.Is(err, store.ErrNotFound): // deleted meanwhile
		if req.Msg.GetAllowMissing() {
			return connect.NewResponse(&sandboxv1.FileSystemSnapshot{}), nil
		}
		return nil, snapshotNotFound(x.ID)
	case err != nil:
		return nil, storeUnavailable(err)
	}
	s.finishDelete(ctx, y)
	return connect.NewResponse(snapshotProto(y)), nil
}

// finishDelete removes DELETING x: its archive, then its row. What fails stays DELETING
// for the reconciler; it reports whether x is gone.
func (s *Server) finishDelete(ctx context.Context, x store.Snapshot) bool {
	ctx = context.WithoutCancel(ctx)
	st, err := s.storeFor(ctx, x.ObjectBucket)
	if err == nil {
		err = st.Delete(ctx, x.ObjectKey)
	}
	switch {
	case bucketGone(err):
		// Its bucket is gone (or cannot be reached by this deployment at all): so is
		// the archive, as far as anyone here can tell.
		s.log.Warn("snapshot: its bucket is gone, deleting the row only", "snapshot", x.ID, "bucket", x.ObjectBucket, "err", err)
	case err != nil && !errors.Is(err, blob.ErrNotFound):
		s.log.Warn("snapshot: delete archive (the reconciler retries)", "snapshot", x.ID, "bucket", x.ObjectBucket, "key", x.ObjectKey, "err", err)
		return false
	}
	if err := s.snaps.Delete(ctx, x.Org, x.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("snapshot: delete row (the reconciler retries)", "snapshot", x.ID, "err", err)
		return false
	}
	s.log.Info("snapshot deleted", "snapshot", x.ID, "org", x.Org)
	return true
}

// snapshotOnDelete takes the snapshots DeleteSandbox asks for (m.snapshot_volumes) and
// deletes the sandbox. Each name must be a scratch volume of the sandbox, which must
// not be ending; one CREATING row per volume is recorded first (idempotent on the
// request's request_id: a replay returns the same IDs and deletes nothing again); then
// the runner stops the sandbox, snapshots the volumes and destroys it. Termination
// proceeds whatever happens to the snapshots: a runner that cannot take them fails them
// and the sandbox is deleted anyway.
func (s *Server) snapshotOnDelete(ctx context.Context, m *sandboxv1.DeleteSandboxRequest, rec *record, r runner.Handle, grace time.Duration) (*sandboxv1.DeleteSandboxResponse, error) {
	if err := s.snapshotsOff(); err != nil {
		return nil, err
	}
	org := principal(ctx).Org
	names := m.GetSnapshotVolumes()
	seen := map[string]bool{}
	for i, n := range names {
		field := fmt.Sprintf("snapshot_volumes[%d]", i)
		if n == "" {
			return nil, apierr.Invalid(apierr.InvalidRequest, field+" is empty", []apierr.Violation{{Field: field, Description: "must name a scratch volume"}})
		}
		if seen[n] {
			return nil, apierr.Invalid(apierr.InvalidRequest, field+" is repeated", []apierr.Violation{{Field: field, Description: fmt.Sprintf("volume %q is named twice", n)}})
		}
		seen[n] = true
		if _, err := scratchVolumeOf(rec.id, rec.spec, n, field); err != nil {
			if apierr.Reason(err) == apierr.InvalidRequest {
				// Not a scratch volume of this sandbox, whatever it is.
				vs := apierr.Violations(err)
				return nil, apierr.Invalid(apierr.VolumeNotSnapshottable, "volume not snapshottable: "+apierr.Describe(vs), vs)
			}
			return nil, err
		}
	}
	rid := m.GetRequestId()
	volRequestID := func(vol string) string {
		if rid == "" {
			return ""
		}
		return onDeletePrefix + vol + "/" + rid
	}
	// A replay of the request returns what the first one recorded.
	rows := make([]store.Snapshot, len(names))
	have := 0
	for i, n := range names {
		if rid == "" {
			break
		}
		x, err := s.snaps.GetByRequestID(ctx, org, volRequestID(n))
		switch {
		case err == nil:
			if x.SourceSandboxID != rec.id || x.Trigger != store.TriggerOnDelete {
				return nil, snapshotRequestIDConflict("request_id")
			}
			rows[i] = x
			have++
		case !errors.Is(err, store.ErrNotFound):
			return nil, storeUnavailable(err)
		}
	}
	if have > 0 && have == len(names) {
		sb := s.current(ctx, rec, r)
		return deleteResponse(s.toProto(rec, sb, r), rows), nil
	}
	sh, err := s.snapshotHandle(ctx, r)
	if err != nil {
		return nil, err
	}
	if sb := s.current(ctx, rec, r); sb.State.Terminal() || sb.State == runner.StateTerminating {
		return nil, apierr.New(apierr.SandboxNotRunning, fmt.Sprintf("sandbox %s is %s: its volumes can no longer be snapshotted", rec.id, sb.State),
			map[string]string{"sandbox_id": rec.id})
	}
	maxSize, err := s.admitSnapshots(ctx, org, rec.id, len(names)-have, true)
	if err != nil {
		return nil, err
	}
	bucket, err := s.snapshotBucketFor(ctx, org)
	if err != nil {
		return nil, err
	}
	targets := make([]runner.SnapshotTarget, len(names))
	for i, n := range names {
		if rows[i].ID == "" {
			id := newSnapshotID()
			x, _, err := s.snaps.Create(ctx, store.Snapshot{ID: id, Org: org, State: store.SnapshotCreating,
				SourceSandboxID: rec.id, SourceVolumeName: n, Trigger: store.TriggerOnDelete, ObjectBucket: bucket,
				ObjectKey: snapshotKey(org, id), RunnerID: r.ID(), RequestID: volRequestID(n)})
			if err != nil {
				return nil, storeUnavailable(err)
			}
			rows[i] = x
		}
		targets[i] = runner.SnapshotTarget{Volume: n, SnapshotID: rows[i].ID, BlobKey: rows[i].ObjectKey, MaxSizeBytes: maxSize, Bucket: s.runnerBucket(rows[i].ObjectBucket)}
	}
	sb, jobs, err := sh.DeleteWithSnapshots(ctx, rec.id, grace, targets)
	if err != nil {
		aerr := runner.APIError(rec.id, err, runner.SpecField)
		s.log.Warn("delete with snapshots failed: failing the snapshots, deleting the sandbox", "sandbox", rec.id, "runner", r.ID(), "err", err)
		for i := range rows {
			if rows[i].State == store.SnapshotCreating {
				rows[i] = s.failSnapshot(ctx, rows[i], aerr)
			}
		}
		if sb, err = r.Delete(ctx, rec.id, grace); err != nil {
			if !errors.Is(err, runtime.ErrNotFound) {
				return nil, runner.APIError(rec.id, err, runner.SpecField)
			}
			sb = s.index.lastOf(rec)
		}
	} else {
		for _, j := range jobs {
			for i := range rows {
				if rows[i].ID == j.SnapshotID {
					rows[i] = s.applyJob(ctx, rows[i], j)
				}
			}
		}
	}
	s.index.setLast(ctx, rec, sb)
	s.views.poke()
	s.log.Info("sandbox deleted with snapshots", "sandbox", rec.id, "org", org, "volumes", names)
	return deleteResponse(s.toProto(rec, sb, r), rows), nil
}

func deleteResponse(sb *sandboxv1.Sandbox, rows []store.Snapshot) *sandboxv1.DeleteSandboxResponse {
	out := &sandboxv1.DeleteSandboxResponse{Sandbox: sb}
	for _, x := range rows {
		out.FileSystemSnapshotIds = append(out.FileSystemSnapshotIds, x.ID)
	}
	return out
}

// restorer is the spec.Restorer of org's creates: a snapshot restored must be the
// caller's (another organization's is FSS_NOT_FOUND, as a missing one), READY, and in
// the bucket snapshots go to now. Lookups are remembered, so converting the spec again
// per candidate runner reads the store once.
func (s *Server) restorer(ctx context.Context, org string) spec.Restorer {
	seen := map[string]runner.SnapshotSource{}
	return func(field, id string) (runner.SnapshotSource, error) {
		if src, ok := seen[id]; ok {
			return src, nil
		}
		vs := func(d string) []apierr.Violation { return []apierr.Violation{{Field: field, Description: d}} }
		meta := map[string]string{"file_system_snapshot_id": id}
		if err := s.snapshotsOff(); err != nil {
			return runner.SnapshotSource{}, err
		}
		x, err := s.snaps.Get(ctx, org, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return runner.SnapshotSource{}, apierr.WithViolations(apierr.New(apierr.FSSNotFound,
				fmt.Sprintf("file-system snapshot %q not found", id), meta), vs("no such snapshot"))
		case err != nil:
			return runner.SnapshotSource{}, storeUnavailable(err)
		}
		if x.State == store.SnapshotCreating {
			x, _ = s.refreshSnapshot(ctx, x)
		}
		if x.State != store.SnapshotReady {
			return runner.SnapshotSource{}, apierr.WithViolations(apierr.New(apierr.FSSNotReady,
				fmt.Sprintf("file-system snapshot %s is %s: only a READY snapshot is restored", id, x.State), meta),
				vs("snapshot is "+x.State+", not READY"))
		}
		if err := s.checkRestoreBucket(ctx, org, x.ObjectBucket); err != nil {
			var ce *connect.Error
			if apierr.Reason(err) == apierr.FSSBucketMismatch && errors.As(err, &ce) {
				err = apierr.WithViolations(ce, vs("snapshot is in bucket "+x.ObjectBucket+", not the organization's snapshot bucket"))
			}
			return runner.SnapshotSource{}, err
		}
		src := runner.SnapshotSource{SnapshotID: x.ID, BlobKey: x.ObjectKey, Digest: x.Digest, SizeBytes: x.SizeBytes, ContentBytes: x.ContentBytes,
			Bucket: s.runnerBucket(x.ObjectBucket)}
		seen[id] = src
		return src, nil
	}
}

// preferForRestores applies the placement preference hook for a sandbox restoring srcs.
func (s *Server) preferForRestores(ctx context.Context, cands []placement.Candidate, srcs map[string]runner.SnapshotSource) []placement.Candidate {
	if s.hooks.prefer == nil || len(srcs) == 0 {
		return cands
	}
	list := make([]runner.SnapshotSource, 0, len(srcs))
	for _, src := range srcs {
		list = append(list, src)
	}
	slices.SortFunc(list, func(a, b runner.SnapshotSource) int { return strings.Compare(a.SnapshotID, b.SnapshotID) })
	return s.hooks.prefer(ctx, cands, list)
}

// ReconcileSnapshots finishes what the snapshot index has in flight, for every
// organization: it asks the runner of each CREATING snapshot for its job and records the
// outcome, fails those whose runner stayed unreachable past the orphan grace ("runner
// unavailable"), and removes DELETING ones (archive, then row). Everything it needs is in
// the store, so a restarted gateway (or another replica) carries on. It returns how many
// snapshots it completed and removed.
func (s *Server) ReconcileSnapshots(ctx context.Context) (completed, deleted int) {
	if s.snapshotsOff() != nil {
		return 0, 0
	}
	creating, err := s.snaps.ListState(ctx, store.SnapshotCreating, store.MaxPageSize)
	if err != nil {
		s.log.Warn("reconcile snapshots: list CREATING", "err", err)
	}
	answered := map[string]bool{}
	for _, x := range creating {
		y, ok := s.refreshSnapshot(ctx, x)
		if ok {
			answered[x.RunnerID] = true
			if y.State != store.SnapshotCreating {
				completed++
			}
			continue
		}
		if answered[x.RunnerID] || s.orphanGrace < 0 {
			continue
		}
		since := s.gone.mark(x.RunnerID)
		if time.Since(since) < s.orphanGrace || time.Since(x.CreateTime) < s.orphanGrace {
			continue
		}
		s.log.Warn("reconcile snapshots: failing a snapshot whose runner is unavailable", "snapshot", x.ID, "runner", x.RunnerID, "since", since)
		s.complete(ctx, x, store.SnapshotCompletion{State: store.SnapshotFailed, Reason: apierr.RunnerUnavailable,
			StateReason: fmt.Sprintf("runner unavailable: runner %s could not be asked about the snapshot for %s", x.RunnerID, time.Since(since).Round(time.Second))})
		completed++
	}
	for id := range answered {
		s.gone.clear(id)
	}
	deleting, err := s.snaps.ListState(ctx, store.SnapshotDeleting, store.MaxPageSize)
	if err != nil {
		s.log.Warn("reconcile snapshots: list DELETING", "err", err)
	}
	for _, x := range deleting {
		if s.finishDelete(ctx, x) {
			deleted++
		}
	}
	return completed, deleted
}
