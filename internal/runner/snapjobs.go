package runner

import (
	"connectrpc.com/connect"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// How the runner takes file-system snapshots (SnapshotHandle). A job is captured
// synchronously (runtime.VolumeCapturer.CaptureVolume: the workload pauses only for
// that) and uploaded in the background: the capture is written as an archive through a
// sha256 and counting writer into a pipe that blob.Store.Put streams (never buffered
// whole). Each job is kept as one small JSON file in DataDir/snapshots, written
// atomically at every change, so GetSnapshotJob answers after a runner restart; a job
// still CREATING when the runner starts lost its upload with the previous process: it
// is FAILED and its object (if any) deleted. Finished jobs are forgotten after
// SnapshotJobRetention.

// Defaults of Config's snapshot limits.
const (
	DefaultSnapshotsPerSandbox = 2
	DefaultSnapshotsPerRunner  = 8
	// SnapshotJobRetention is how long a finished job stays readable (the gateway polls
	// it until it has recorded the outcome).
	SnapshotJobRetention = 24 * time.Hour
	// maxSnapshotJobs bounds the jobs a runner keeps (finished ones are dropped oldest
	// first past it; a new job past it with only unfinished ones is refused).
	maxSnapshotJobs = 4096
	// maxRestoreFiles bounds the entries of an archive a volume is restored from.
	maxRestoreFiles = 1 << 20
)

// snapshotIDPattern is what a snapshot ID may be: it names the job's file.
var snapshotIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// digestPattern is a hex sha256.
var digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// errSizeExceeded: the archive grew past the target's MaxSizeBytes.
var errSizeExceeded = errors.New("snapshot archive exceeds its maximum size")

// jobRecord is a job as kept (in memory and in its file).
type jobRecord struct {
	Job     SnapshotJob `json:"job"`
	BlobKey string      `json:"blob_key"`
	// Bucket holds BlobKey ("" for the runner's own store).
	Bucket string `json:"bucket,omitempty"`
	// Updated is when the job last changed (a finished job is forgotten
	// SnapshotJobRetention after).
	Updated time.Time `json:"updated"`
	// deleteTarget: the job counts toward the per-runner limit only (a delete's
	// snapshots of a sandbox's own volumes, whatever their number).
	deleteTarget bool
}

// snapJobs are the runner's snapshot jobs.
type snapJobs struct {
	dir  string
	mu   sync.Mutex
	jobs map[string]*jobRecord
}

func (j *snapJobs) path(id string) string { return filepath.Join(j.dir, id+".json") }

// saveLocked writes rec's file (called with mu held; the file is small).
func (j *snapJobs) saveLocked(rec *jobRecord) error {
	rec.Updated = time.Now()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileAtomic(j.path(rec.Job.SnapshotID), b)
}

// pruneLocked forgets finished jobs older than SnapshotJobRetention, and the oldest
// finished ones while more than maxSnapshotJobs-1 are kept.
func (j *snapJobs) pruneLocked(now time.Time) {
	var finished []*jobRecord
	for id, rec := range j.jobs {
		if rec.Job.State == SnapshotCreating {
			continue
		}
		if now.Sub(rec.Updated) > SnapshotJobRetention {
			delete(j.jobs, id)
			_ = os.Remove(j.path(id))
			continue
		}
		finished = append(finished, rec)
	}
	if len(j.jobs) < maxSnapshotJobs {
		return
	}
	slices.SortFunc(finished, func(a, b *jobRecord) int { return a.Updated.Compare(b.Updated) })
	for _, rec := range finished {
		if len(j.jobs) < maxSnapshotJobs {
			return
		}
		delete(j.jobs, rec.Job.SnapshotID)
		_ = os.Remove(j.path(rec.Job.SnapshotID))
	}
}

// inflightLocked counts the CREATING jobs of sandbox (those counting toward its limit)
// and of the whole runner.
func (j *snapJobs) inflightLocked(sandbox string) (perSandbox, total int) {
	for _, rec := range j.jobs {
		if rec.Job.State != SnapshotCreating {
			continue
		}
		total++
		if rec.Job.SandboxID == sandbox && !rec.deleteTarget {
			perSandbox++
		}
	}
	return perSandbox, total
}

// openSnapJobs loads the jobs an earlier runner kept in dir: a job still CREATING lost
// its upload with that runner and becomes FAILED (its partial object, if any, is
// deleted in the background by the caller: returned in orphans); finished jobs past
// their retention are forgotten.
func openSnapJobs(dir string) (*snapJobs, []orphan, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("runner: create snapshot job dir: %w", err)
	}
	j := &snapJobs{dir: dir, jobs: map[string]*jobRecord{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("runner: read snapshot jobs: %w", err)
	}
	var orphans []orphan
	for _, ent := range ents {
		id, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !ent.Type().IsRegular() || !snapshotIDPattern.MatchString(id) {
			_ = os.Remove(filepath.Join(dir, ent.Name())) // a temporary file a crash left
			continue
		}
		var rec jobRecord
		b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.Job.SnapshotID != id {
			_ = os.Remove(filepath.Join(dir, ent.Name()))
			continue
		}
		j.jobs[id] = &rec
		if rec.Job.State == SnapshotCreating {
			rec.Job.State, rec.Job.Reason = SnapshotFailed, apierr.FSSCreateFailed
			rec.Job.Message = "the runner restarted during the upload"
			rec.Job.CompleteTime = time.Now()
			if err := j.saveLocked(&rec); err != nil {
				return nil, nil, fmt.Errorf("runner: record snapshot job: %w", err)
			}
			if blob.ValidateKey(rec.BlobKey) == nil && (rec.Bucket == "" || s3.BucketNameProblem(rec.Bucket) == "") {
				orphans = append(orphans, orphan{bucket: rec.Bucket, key: rec.BlobKey})
			}
		}
	}
	j.pruneLocked(time.Now())
	return j, orphans, nil
}

// orphan is the object of an upload an earlier runner did not finish.
type orphan struct{ bucket, key string }

// deleteOrphans removes the objects of uploads an earlier runner did not finish, each in
// its bucket.
func (r *Runner) deleteOrphans(orphans []orphan) {
	if len(orphans) == 0 || r.cfg.Blobs == nil {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for _, o := range orphans {
			ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
			st, err := r.buckets.Store(ctx, o.bucket)
			if err == nil {
				err = st.Delete(ctx, o.key)
			}
			cancel()
			if err != nil && !errors.Is(err, blob.ErrNotFound) {
				r.log.Warn("delete the object of an interrupted snapshot upload", "bucket", o.bucket, "key", o.key, "err", err)
			}
		}
	}()
}

// storeFor is the store of bucket ("" for the runner's own): another bucket is opened on
// the runner's S3 endpoint with its credentials (once, then kept). Errors are API errors
// CWSANDBOX_FSS_BUCKET_UNAVAILABLE.
func (r *Runner) storeFor(ctx context.Context, bucket string) (blob.Store, error) {
	st, err := r.buckets.Store(ctx, bucket)
	if err == nil {
		return st, nil
	}
	meta := map[string]string{"bucket": textclip.Clip(bucket, 64)}
	if errors.Is(err, blobconfig.ErrNoOtherBucket) {
		return nil, apierr.New(apierr.FSSBucketUnavailable,
			fmt.Sprintf("bucket %s cannot be used: this runner's blob store is not S3, it has no other bucket", textclip.Clip(bucket, 64)), meta)
	}
	r.log.Warn("open a snapshot bucket", "bucket", bucket, "err", err)
	why := "an error on the runner (see its log)"
	if errors.Is(err, s3.ErrNoSuchBucket) {
		why = "it does not exist"
	}
	return nil, apierr.New(apierr.FSSBucketUnavailable, fmt.Sprintf("bucket %s cannot be used: %s", textclip.Clip(bucket, 64), why), meta)
}

// snapshotSupport is why the runner takes no snapshots ("" when it does).
func (r *Runner) snapshotSupport() (runtime.VolumeCapturer, string) {
	vc, ok := r.backend.(runtime.VolumeCapturer)
	switch {
	case r.cfg.Blobs == nil:
		return nil, "this runner has no blob store configured"
	case !ok:
		return nil, "this runner's backend cannot snapshot volumes"
	}
	return vc, ""
}

func fssNotSupported(why string) error {
	return apierr.New(apierr.FSSNotSupported, "file-system snapshots are not supported here: "+why, nil)
}

// validateTarget checks a snapshot target's shape; field names are under prefix.
func validateTarget(vs *violations, prefix string, t SnapshotTarget) {
	if !snapshotIDPattern.MatchString(t.SnapshotID) {
		vs.add(prefix+"snapshot_id", "must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-', starting with a letter or digit")
	}
	if err := blob.ValidateKey(t.BlobKey); err != nil {
		vs.add(prefix+"blob_key", "%v", err)
	}
	if t.Volume == "" {
		vs.add(prefix+"volume", "is required")
	}
	if t.MaxSizeBytes < 0 {
		vs.add(prefix+"max_size_bytes", "must not be negative, got %d", t.MaxSizeBytes)
	}
	if t.Bucket != "" {
		if why := s3.BucketNameProblem(t.Bucket); why != "" {
			vs.add(prefix+"bucket", "%s", why)
		}
	}
}

func volumeNotSnapshottable(sandbox, volume string) error {
	return apierr.New(apierr.VolumeNotSnapshottable,
		fmt.Sprintf("sandbox %s has no scratch volume %q to snapshot", sandbox, textclip.Clip(volume, 64)),
		map[string]string{"sandbox_id": sandbox, "volume": textclip.Clip(volume, 64)})
}

func hasVolume(s runtime.Spec, name string) bool {
	return slices.ContainsFunc(s.Volumes, func(v runtime.Volume) bool { return v.Name == name })
}

func (rec *jobRecord) copyJob() SnapshotJob { return rec.Job }

// SnapshotVolume captures the scratch volume t.Volume of the running sandbox id and
// returns the job CREATING (or FAILED when the capture failed); the archive is uploaded
// in the background. Idempotent per t.SnapshotID: a job of that ID is returned as it is.
// Errors: runtime.ErrNotFound, ErrNotRunning, *ValidationError, and API errors
// CWSANDBOX_VOLUME_NOT_SNAPSHOTTABLE, CWSANDBOX_FSS_NOT_SUPPORTED,
// CWSANDBOX_FSS_INFLIGHT_LIMIT.
func (r *Runner) SnapshotVolume(ctx context.Context, id string, t SnapshotTarget) (SnapshotJob, error) {
	var vs violations
	validateTarget(&vs, "target.", t)
	if err := vs.err(); err != nil {
		return SnapshotJob{}, err
	}
	j := r.snaps
	j.mu.Lock()
	if rec, ok := j.jobs[t.SnapshotID]; ok {
		defer j.mu.Unlock()
		return rec.copyJob(), nil
	}
	j.mu.Unlock()
	vc, why := r.snapshotSupport()
	if why != "" {
		return SnapshotJob{}, fssNotSupported(why)
	}
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	var st State
	var spec runtime.Spec
	if ok {
		st, spec = e.sb.State, e.sb.Spec
	}
	r.mu.Unlock()
	switch {
	case !ok:
		return SnapshotJob{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	case st != StateRunning:
		return SnapshotJob{}, fmt.Errorf("%w: %s is %s", ErrNotRunning, id, st)
	case !hasVolume(spec, t.Volume):
		return SnapshotJob{}, volumeNotSnapshottable(id, t.Volume)
	}
	if _, err := r.storeFor(ctx, t.Bucket); err != nil {
		return SnapshotJob{}, err
	}
	rec, existing, err := r.reserveJob(id, t, false)
	if err != nil || existing {
		return rec, err
	}
	c, err := vc.CaptureVolume(ctx, id, t.Volume)
	switch {
	case errors.Is(err, runtime.ErrVolumeNotFound):
		r.dropJob(t.SnapshotID)
		return SnapshotJob{}, volumeNotSnapshottable(id, t.Volume)
	case errors.Is(err, errdefs.ErrNotImplemented):
		r.dropJob(t.SnapshotID)
		return SnapshotJob{}, fssNotSupported(fmt.Sprintf("volume %q cannot be captured by this runner's backend: %s", t.Volume, backendRefusal(err)))
	case errors.Is(err, runtime.ErrNotFound):
		r.dropJob(t.SnapshotID)
		return SnapshotJob{}, err
	case err != nil:
		r.log.Warn("capture a volume", "sandbox", id, "volume", t.Volume, "err", err)
		return r.failJob(t.SnapshotID, apierr.FSSCreateFailed, "capturing the volume failed: "+shownCause(err)), nil
	}
	return r.startUpload(t, c), nil
}

// reserveJob records a CREATING job for target t of sandbox id unless one of its ID
// exists (then returned, existing), within the in-flight limits (a delete's target:
// only the runner's).
func (r *Runner) reserveJob(id string, t SnapshotTarget, deleteTarget bool) (SnapshotJob, bool, error) {
	j := r.snaps
	j.mu.Lock()
	defer j.mu.Unlock()
	if rec, ok := j.jobs[t.SnapshotID]; ok {
		return rec.copyJob(), true, nil
	}
	j.pruneLocked(time.Now())
	perSandbox, total := j.inflightLocked(id)
	meta := map[string]string{"sandbox_id": id}
	switch {
	case !deleteTarget && perSandbox >= r.cfg.SnapshotsPerSandbox:
		return SnapshotJob{}, false, apierr.WithRetry(apierr.New(apierr.FSSInflightLimit,
			fmt.Sprintf("sandbox %s has %d snapshots in flight, as many as one sandbox may: retry when one is done", id, perSandbox), meta), 5*time.Second)
	case total >= r.cfg.SnapshotsPerRunner:
		return SnapshotJob{}, false, apierr.WithRetry(apierr.New(apierr.FSSInflightLimit,
			fmt.Sprintf("the runner has %d snapshots in flight, as many as it takes at once: retry when one is done", total), meta), 5*time.Second)
	case len(j.jobs) >= maxSnapshotJobs:
		return SnapshotJob{}, false, apierr.WithRetry(apierr.New(apierr.FSSInflightLimit,
			"the runner keeps as many snapshot jobs as it may: retry later", meta), time.Minute)
	}
	rec := &jobRecord{Job: SnapshotJob{SnapshotID: t.SnapshotID, SandboxID: id, Volume: t.Volume, State: SnapshotCreating},
		BlobKey: t.BlobKey, Bucket: t.Bucket, deleteTarget: deleteTarget}
	if err := j.saveLocked(rec); err != nil {
		return SnapshotJob{}, false, fmt.Errorf("record snapshot job: %w", err)
	}
	j.jobs[t.SnapshotID] = rec
	return rec.copyJob(), false, nil
}

// dropJob forgets a job reserved for a call that was refused after all.
func (r *Runner) dropJob(snapshotID string) {
	j := r.snaps
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.jobs, snapshotID)
	_ = os.Remove(j.path(snapshotID))
}

// updateJob changes a job and records it.
func (r *Runner) updateJob(snapshotID string, fn func(*SnapshotJob)) SnapshotJob {
	j := r.snaps
	j.mu.Lock()
	defer j.mu.Unlock()
	rec, ok := j.jobs[snapshotID]
	if !ok {
		return SnapshotJob{}
	}
	fn(&rec.Job)
	if err := j.saveLocked(rec); err != nil {
		r.log.Warn("record snapshot job", "snapshot", snapshotID, "err", err)
	}
	return rec.copyJob()
}

// failJob ends a job FAILED with reason and msg.
func (r *Runner) failJob(snapshotID, reason, msg string) SnapshotJob {
	r.log.Warn("snapshot failed", "snapshot", snapshotID, "reason", reason, "err", msg)
	return r.updateJob(snapshotID, func(jb *SnapshotJob) {
		jb.State, jb.Reason, jb.Message, jb.CompleteTime = SnapshotFailed, reason, textclip.Clip(msg, 512), time.Now()
	})
}

// startUpload records the capture's pause and uploads it in the background; the
// capture is closed when the upload ends.
func (r *Runner) startUpload(t SnapshotTarget, c runtime.VolumeCapture) SnapshotJob {
	job := r.updateJob(t.SnapshotID, func(jb *SnapshotJob) { jb.Pause = c.Pause() })
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { _ = c.Close() }()
		r.upload(t, c)
	}()
	return job
}

// countingWriter hashes and counts what passes to w, and fails past max (0: no limit).
type countingWriter struct {
	w   io.Writer
	h   hash.Hash
	n   int64
	max int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.max > 0 && c.n+int64(len(p)) > c.max {
		return 0, errSizeExceeded
	}
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// upload streams the capture's archive into the blob store under t.BlobKey and ends the
// job READY or FAILED.
func (r *Runner) upload(t SnapshotTarget, c runtime.VolumeCapture) {
	ctx := r.ctx
	store, err := r.storeFor(ctx, t.Bucket)
	if err != nil {
		if ctx.Err() == nil {
			r.failJob(t.SnapshotID, apierr.FSSBucketUnavailable, apiMessage(err))
		}
		return
	}
	pr, pw := io.Pipe()
	cw := &countingWriter{w: pw, h: sha256.New(), max: t.MaxSizeBytes}
	var (
		stats   runtime.ArchiveStats
		archErr error
		written = make(chan struct{})
	)
	go func() {
		defer close(written)
		stats, archErr = c.WriteArchive(ctx, cw)
		if archErr == nil {
			_ = pw.Close()
		} else {
			_ = pw.CloseWithError(archErr)
		}
	}()
	info, putErr := store.Put(ctx, t.BlobKey, pr, -1)
	_ = pr.CloseWithError(errors.New("upload ended")) // unblocks the writer when Put gave up early
	<-written
	if ctx.Err() != nil {
		// The runner is closing: the job stays CREATING on disk, and the next runner
		// fails it and deletes what may have been stored.
		return
	}
	digest := hex.EncodeToString(cw.h.Sum(nil))
	var reason, msg string
	switch {
	case errors.Is(archErr, errSizeExceeded):
		reason, msg = apierr.FSSSizeExceeded, fmt.Sprintf("the snapshot archive exceeds its maximum size of %d bytes", t.MaxSizeBytes)
	case archErr != nil:
		r.log.Warn("archive a volume", "snapshot", t.SnapshotID, "err", archErr)
		reason, msg = apierr.FSSCreateFailed, "archiving the volume failed: "+shownCause(archErr)
	case putErr != nil:
		r.log.Warn("upload a snapshot archive", "snapshot", t.SnapshotID, "err", putErr)
		reason, msg = apierr.FSSBucketUnavailable, "uploading the snapshot archive to the blob store failed: "+shownCause(putErr)
	case info.SHA256 != digest || info.Size != cw.n:
		reason, msg = apierr.FSSCreateFailed, fmt.Sprintf("the blob store recorded %d bytes of sha256 %s, %d bytes of sha256 %s were written", info.Size, info.SHA256, cw.n, digest)
	}
	if reason != "" {
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := store.Delete(dctx, t.BlobKey); err != nil && !errors.Is(err, blob.ErrNotFound) {
			r.log.Warn("delete the object of a failed snapshot", "snapshot", t.SnapshotID, "err", err)
		}
		cancel()
		r.failJob(t.SnapshotID, reason, msg)
		return
	}
	r.updateJob(t.SnapshotID, func(jb *SnapshotJob) {
		jb.State, jb.SizeBytes, jb.Digest, jb.ContentBytes, jb.CompleteTime = SnapshotReady, cw.n, digest, stats.Bytes, time.Now()
	})
	r.log.Info("snapshot ready", "snapshot", t.SnapshotID, "bytes", cw.n, "content_bytes", stats.Bytes)
}

// GetSnapshotJob reports a job; one the runner does not know is FAILED and Unknown: the
// gateway reads that as "not registered (yet)" and keeps a young snapshot CREATING
// (internal/gateway applyJob).
func (r *Runner) GetSnapshotJob(snapshotID string) SnapshotJob {
	j := r.snaps
	j.mu.Lock()
	defer j.mu.Unlock()
	if rec, ok := j.jobs[snapshotID]; ok {
		return rec.copyJob()
	}
	return SnapshotJob{SnapshotID: snapshotID, State: SnapshotFailed, Reason: apierr.FSSCreateFailed, Unknown: true,
		Message: "snapshot job unknown to this runner (lost with a restart before it started, or long finished)"}
}

// pendingCapture is a delete's snapshot target, captured once the containers stopped.
type pendingCapture struct{ t SnapshotTarget }

// DeleteWithSnapshots is Delete that snapshots targets once the sandbox's containers
// have stopped and before it is destroyed; the uploads go on after the destroy. It
// returns one job per target, in order: CREATING, or FAILED when refused (no such
// volume, no support, the runner's in-flight limit, the sandbox already ended).
// Termination proceeds whatever happens to the snapshots. A delete's targets count
// toward the runner's in-flight limit, not the sandbox's (they are its own volumes).
func (r *Runner) DeleteWithSnapshots(id string, grace time.Duration, targets []SnapshotTarget) (Sandbox, []SnapshotJob, error) {
	if len(targets) == 0 {
		sb, err := r.Delete(id, grace)
		return sb, nil, err
	}
	var vs violations
	seen := map[string]bool{}
	for i, t := range targets {
		prefix := fmt.Sprintf("snapshots[%d].", i)
		validateTarget(&vs, prefix, t)
		if seen[t.SnapshotID] {
			vs.add(prefix+"snapshot_id", "repeats %q", t.SnapshotID)
		}
		seen[t.SnapshotID] = true
	}
	if err := vs.err(); err != nil {
		return Sandbox{}, nil, err
	}
	r.mu.Lock()
	e, ok := r.sandboxes[id]
	var spec runtime.Spec
	var ended bool
	if ok {
		spec, ended = e.sb.Spec, e.sb.State.Terminal() || e.capturesTaken
	}
	r.mu.Unlock()
	if !ok {
		return Sandbox{}, nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	_, why := r.snapshotSupport()
	jobs := make([]SnapshotJob, len(targets))
	var pending []pendingCapture
	for i, t := range targets {
		refuse := func(reason, msg string) {
			jobs[i] = r.recordFailed(id, t, reason, msg)
		}
		switch {
		case why != "":
			refuse(apierr.FSSNotSupported, "file-system snapshots are not supported here: "+why)
			continue
		case !hasVolume(spec, t.Volume):
			refuse(apierr.VolumeNotSnapshottable, fmt.Sprintf("sandbox %s has no scratch volume %q to snapshot", id, textclip.Clip(t.Volume, 64)))
			continue
		case ended:
			refuse(apierr.FSSCreateFailed, fmt.Sprintf("sandbox %s has already ended: its volumes are gone", id))
			continue
		}
		if _, err := r.storeFor(r.ctx, t.Bucket); err != nil {
			refuse(apierr.FSSBucketUnavailable, apiMessage(err))
			continue
		}
		job, existing, err := r.reserveJob(id, t, true)
		switch {
		case err != nil:
			refuse(apierr.Reason(err), err.Error())
		case existing:
			jobs[i] = job
		default:
			jobs[i] = job
			pending = append(pending, pendingCapture{t})
		}
	}
	if lc, ok := r.backend.(runtime.LiveCapturer); ok && lc.CapturesLive() && len(pending) > 0 {
		// This backend captures only a running sandbox: now, before the stop (the
		// backend keeps the sandbox until the captures are closed).
		r.captureNow(id, pending, jobs)
		pending = nil
	}
	r.mu.Lock()
	if e.sb.State.Terminal() || e.capturesTaken {
		// Ended meanwhile: the reserved jobs cannot be captured.
		r.mu.Unlock()
		for _, p := range pending {
			for i := range jobs {
				if jobs[i].SnapshotID == p.t.SnapshotID {
					jobs[i] = r.failJob(p.t.SnapshotID, apierr.FSSCreateFailed, fmt.Sprintf("sandbox %s has already ended: its volumes are gone", id))
				}
			}
		}
		r.mu.Lock()
	} else {
		e.captures = append(e.captures, pending...)
	}
	if !e.sb.State.Terminal() {
		r.requestStopLocked(e, ReasonDeleted, max(grace, 0))
		if e.sb.State != StateTerminating {
			e.sb.State = StateTerminating
			r.notifyLocked(e)
		}
	}
	sb := e.snapshot()
	r.mu.Unlock()
	return sb, jobs, nil
}

// recordFailed records a refused target as a FAILED job (unless a job of its ID exists,
// which is returned instead), so that GetSnapshotJob reports it too.
func (r *Runner) recordFailed(id string, t SnapshotTarget, reason, msg string) SnapshotJob {
	j := r.snaps
	j.mu.Lock()
	defer j.mu.Unlock()
	if rec, ok := j.jobs[t.SnapshotID]; ok {
		return rec.copyJob()
	}
	rec := &jobRecord{Job: SnapshotJob{SnapshotID: t.SnapshotID, SandboxID: id, Volume: t.Volume, State: SnapshotFailed,
		Reason: reason, Message: textclip.Clip(msg, 512), CompleteTime: time.Now()}, BlobKey: t.BlobKey, Bucket: t.Bucket}
	if len(j.jobs) < maxSnapshotJobs {
		if err := j.saveLocked(rec); err != nil {
			r.log.Warn("record snapshot job", "snapshot", t.SnapshotID, "err", err)
		}
		j.jobs[t.SnapshotID] = rec
	}
	return rec.copyJob()
}

// captureNow captures a delete's pending targets at once (runtime.LiveCapturer) and
// starts their uploads; jobs (in the delete's order) get each one's state.
func (r *Runner) captureNow(id string, pending []pendingCapture, jobs []SnapshotJob) {
	vc, _ := r.snapshotSupport()
	for _, p := range pending {
		var job SnapshotJob
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
		c, err := vc.CaptureVolume(ctx, id, p.t.Volume)
		cancel()
		if err != nil {
			r.log.Warn("capture a volume", "sandbox", id, "volume", p.t.Volume, "err", err)
			job = r.failJob(p.t.SnapshotID, apierr.FSSCreateFailed, "capturing the volume failed: "+shownCause(err))
		} else {
			job = r.startUpload(p.t, c)
		}
		for i := range jobs {
			if jobs[i].SnapshotID == p.t.SnapshotID {
				jobs[i] = job
			}
		}
	}
}

// takeCaptures captures the volumes a delete asked for, once the sandbox's containers
// have stopped and before it is destroyed (created: the backend created it; else every
// one fails). A failed capture fails its job; the teardown goes on regardless.
func (r *Runner) takeCaptures(e *entry, created bool) {
	r.mu.Lock()
	e.capturesTaken = true
	pending := e.captures
	e.captures = nil
	id := e.sb.ID
	r.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	vc, why := r.snapshotSupport()
	for _, p := range pending {
		if !created {
			r.failJob(p.t.SnapshotID, apierr.FSSCreateFailed, fmt.Sprintf("sandbox %s never started: nothing to snapshot", id))
			continue
		}
		if why != "" {
			r.failJob(p.t.SnapshotID, apierr.FSSNotSupported, why)
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
		c, err := vc.CaptureVolume(ctx, id, p.t.Volume)
		cancel()
		if err != nil {
			r.log.Warn("capture a volume", "sandbox", id, "volume", p.t.Volume, "err", err)
			r.failJob(p.t.SnapshotID, apierr.FSSCreateFailed, "capturing the volume failed: "+shownCause(err))
			continue
		}
		r.startUpload(p.t, c)
	}
}

// validateRestores checks req.Restores against its spec's scratch volumes and sets each
// restored volume's RestoreDigest (a digest a caller set without a restore is cleared:
// the backend would restore from whatever archive it names).
func validateRestores(req *CreateRequest) error {
	for i := range req.Spec.Volumes {
		req.Spec.Volumes[i].RestoreDigest = ""
	}
	if len(req.Restores) == 0 {
		return nil
	}
	var vs violations
	names := make([]string, 0, len(req.Restores))
	for name := range req.Restores {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		src := req.Restores[name]
		i := slices.IndexFunc(req.Spec.Volumes, func(v runtime.Volume) bool { return v.Name == name })
		if i < 0 {
			vs.add("spec.volumes", "no scratch volume %q to restore from snapshot %s", textclip.Clip(name, 64), textclip.Clip(src.SnapshotID, 64))
			continue
		}
		field := fmt.Sprintf("spec.volumes[%d].scratch.restore_from_snapshot_id", i)
		switch {
		case src.SnapshotID == "":
			vs.add(field, "is required")
		case !digestPattern.MatchString(src.Digest):
			vs.add(field, "snapshot %s: its digest %q is no hex sha256", textclip.Clip(src.SnapshotID, 64), textclip.Clip(src.Digest, 80))
		case blob.ValidateKey(src.BlobKey) != nil:
			vs.add(field, "snapshot %s: %v", textclip.Clip(src.SnapshotID, 64), blob.ValidateKey(src.BlobKey))
		case src.Bucket != "" && s3.BucketNameProblem(src.Bucket) != "":
			vs.add(field, "snapshot %s: bucket %q %s", textclip.Clip(src.SnapshotID, 64), textclip.Clip(src.Bucket, 64), s3.BucketNameProblem(src.Bucket))
		case src.SizeBytes <= 0 || src.ContentBytes < 0:
			vs.add(field, "snapshot %s: archive size %d and content size %d: want positive and not negative", textclip.Clip(src.SnapshotID, 64), src.SizeBytes, src.ContentBytes)
		default:
			req.Spec.Volumes[i].RestoreDigest = src.Digest
		}
	}
	return vs.err()
}

// restoreSupport is why the runner restores no snapshots ("" when it does).
func (r *Runner) restoreSupport() (runtime.SnapshotCache, string) {
	sc, ok := r.backend.(runtime.SnapshotCache)
	switch {
	case r.cfg.Blobs == nil:
		return nil, "this runner has no blob store configured"
	case !ok:
		return nil, "this runner's backend cannot restore volumes from snapshots"
	}
	return sc, ""
}

// prepareRestores has the backend ready every archive e's volumes restore from, before
// it creates the sandbox: each downloaded at most once at a time per digest (concurrent
// creates from one snapshot share the download) and checked against its digest.
func (r *Runner) prepareRestores(ctx context.Context, e *entry) error {
	if len(e.restores) == 0 {
		return nil
	}
	sc, why := r.restoreSupport()
	if why != "" {
		return errors.New(why)
	}
	r.mu.Lock()
	vols := slices.Clone(e.sb.Spec.Volumes)
	r.mu.Unlock()
	for _, v := range vols {
		src, ok := e.restores[v.Name]
		if !ok || v.RestoreDigest == "" {
			continue
		}
		limits := runtime.ArchiveLimits{MaxBytes: max(src.ContentBytes, v.SizeBytes), MaxFiles: maxRestoreFiles}
		prepare := func() error {
			return sc.PrepareSnapshot(ctx, src.Digest, limits, func(ctx context.Context) (io.ReadCloser, error) {
				store, err := r.storeFor(ctx, src.Bucket)
				if err != nil {
					return nil, err
				}
				rc, err := store.Get(ctx, src.BlobKey)
				if err != nil {
					return nil, err
				}
				return blob.VerifyReader(rc, src.SizeBytes, src.Digest), nil
			})
		}
		err := r.restoreFlight.do(ctx, src.Digest, prepare)
		for try := 0; try < 3 && err != nil && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)); try++ {
			// The create whose download this one shared was deleted meanwhile: not ours.
			err = r.restoreFlight.do(ctx, src.Digest, prepare)
		}
		if err != nil {
			r.log.Warn("restore a volume", "sandbox", e.sb.ID, "volume", v.Name, "snapshot", src.SnapshotID, "err", err)
			return fmt.Errorf("volume %q from snapshot %s: %s", v.Name, src.SnapshotID, shownCause(err))
		}
	}
	return nil
}

// shownCause is what a user is told of err, a failure of the backend or the blob store
// (the runner's log has the whole error): what it is about, never host paths or
// addresses that the full text may hold.
func shownCause(err error) string {
	switch {
	case apierr.Reason(err) == apierr.FSSBucketUnavailable: // storeFor's: names the bucket only
		return apiMessage(err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "interrupted (" + err.Error() + ")"
	case errors.Is(err, blob.ErrCorrupt):
		return "the archive does not match its sha256 digest"
	case errors.Is(err, blob.ErrNotFound):
		return "the archive is missing from the blob store"
	case errors.Is(err, fsarchive.ErrTooLarge):
		return "the archive holds more than the volume may (its size limit)"
	case errors.Is(err, fsarchive.ErrInvalid):
		return "the archive is invalid: " + textclip.Clip(err.Error(), 256) // names paths inside the archive only
	case errors.Is(err, errdefs.ErrNotImplemented):
		return "not supported by this runner's backend: " + backendRefusal(err)
	}
	return "an error on the runner (see its log)"
}

// maxBackendRefusal bounds backendRefusal's text.
const maxBackendRefusal = 512

// backendRefusal is why a backend refused something it does not do
// (errdefs.ErrNotImplemented): its text without that error's own words, clipped. A
// backend's ErrNotImplemented says what of the caller's request or of the sandbox it
// cannot take (a volume's mounts, a medium, a platform), never host paths or addresses.
func backendRefusal(err error) string {
	msg := strings.Replace(err.Error(), errdefs.ErrNotImplemented.Error()+": ", "", 1)
	return textclip.Clip(msg, maxBackendRefusal)
}

// apiMessage is the message of an API error without its code's prefix.
func apiMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// flights runs one call per key at a time; callers of a key in flight wait for it and
// share its result.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

func (f *flights) do(ctx context.Context, key string, fn func() error) error {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	if fl, ok := f.m[key]; ok {
		f.mu.Unlock()
		select {
		case <-fl.done:
			return fl.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fl := &flight{done: make(chan struct{})}
	f.m[key] = fl
	f.mu.Unlock()
	fl.err = fn()
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
	close(fl.done)
	return fl.err
}

// CachedSnapshots are the digests of the archives the backend has ready, most recently
// used first (at most MaxCachedSnapshotsReported); nil when it restores none.
func (r *Runner) CachedSnapshots() []string {
	if sc, ok := r.backend.(runtime.SnapshotCache); ok && r.cfg.Blobs != nil {
		return sc.CachedSnapshots(MaxCachedSnapshotsReported)
	}
	return nil
}
