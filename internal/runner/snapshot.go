package runner

import (
	"context"
	"time"
)

// File-system snapshots as the runner takes them (runner.proto SnapshotVolume,
// GetSnapshotJob, DeleteRequest.snapshots). The gateway keeps the index; the runner that
// owns a sandbox captures its volume (runtime.VolumeCapturer) and uploads the archive to
// the blob store under the key the gateway chose, and reports the job until the gateway
// has recorded its outcome.

// MaxCachedSnapshotsReported bounds Capacity.CachedSnapshots.
const MaxCachedSnapshotsReported = 256

// SnapshotTarget names a snapshot to take of a scratch volume.
type SnapshotTarget struct {
	Volume     string
	SnapshotID string
	BlobKey    string
	// MaxSizeBytes bounds the archive; 0 = no limit. Larger fails CWSANDBOX_FSS_SIZE_EXCEEDED.
	MaxSizeBytes int64
	// Bucket is where the archive goes: "" for the runner's own blob store; another
	// bucket is reached on the runner's S3 endpoint with its credentials (an
	// organization's own snapshot bucket). A runner without an S3 store fails it
	// CWSANDBOX_FSS_BUCKET_UNAVAILABLE.
	Bucket string
}

// SnapshotSource is a READY snapshot a volume is restored from.
type SnapshotSource struct {
	SnapshotID   string
	BlobKey      string
	Digest       string // hex sha256 of the archive
	SizeBytes    int64  // of the archive
	ContentBytes int64  // sum of its files' sizes
	Bucket       string // holding the archive: as SnapshotTarget.Bucket
}

// SnapshotJobState is where a snapshot job is.
type SnapshotJobState int

const (
	SnapshotCreating SnapshotJobState = iota + 1
	SnapshotReady
	SnapshotFailed
)

// SnapshotJob is a snapshot as the runner taking it knows it.
type SnapshotJob struct {
	SnapshotID, SandboxID, Volume string
	State                         SnapshotJobState
	// Reason (a CWSANDBOX_FSS_* reason) and Message say why a job FAILED.
	Reason, Message string
	SizeBytes       int64  // READY: the archive's size
	Digest          string // READY: hex sha256 of the archive
	ContentBytes    int64  // READY: sum of its files' sizes
	Pause           time.Duration
	CompleteTime    time.Time
	// Unknown: the runner does not know the job (FAILED; GetSnapshotJob).
	Unknown bool
}

// SnapshotHandle is implemented by Handles whose runner takes file-system snapshots (the
// local Handle and runnerapi.Client); the gateway refuses snapshots on others.
type SnapshotHandle interface {
	Handle
	// SnapshotVolume captures the volume of a running sandbox and returns the job
	// CREATING (idempotent per SnapshotID).
	SnapshotVolume(ctx context.Context, sandboxID string, t SnapshotTarget) (SnapshotJob, error)
	// GetSnapshotJob reports a job; one the runner does not know is FAILED with a reason
	// and Unknown.
	GetSnapshotJob(ctx context.Context, snapshotID string) (SnapshotJob, error)
	// DeleteWithSnapshots is Delete that snapshots targets once the containers have
	// stopped and before the sandbox is destroyed; it returns one job per target.
	DeleteWithSnapshots(ctx context.Context, id string, grace time.Duration, targets []SnapshotTarget) (Sandbox, []SnapshotJob, error)
}
