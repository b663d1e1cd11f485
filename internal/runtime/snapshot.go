package runtime

import (
	"context"
	"io"
	"time"
)

// File-system snapshots of scratch volumes (the public API's FileSystemSnapshot).
//
// A snapshot is taken in two steps so that the workload pauses only for the first: Capture
// freezes a consistent copy of the volume (copy-on-write where the backend can: a btrfs
// snapshot on the local backend), and the capture is then streamed as an archive
// (internal/fsarchive: zstd-compressed tar) while the sandbox runs on or is torn down.
// A capture outlives its sandbox: Destroy never removes it; Close does.
//
// Restore is by archive digest: the runner hands the backend an archive once
// (PrepareSnapshot, which unpacks or caches it), and a Spec volume naming that digest
// (Volume.RestoreDigest) is filled from it before any container starts.

// VolumeCapturer is implemented by backends that can snapshot a scratch volume.
type VolumeCapturer interface {
	// CaptureVolume captures the scratch volume called volume of sandbox id (running, or
	// stopped but not yet destroyed). Errors: ErrNotFound (no such sandbox),
	// ErrVolumeNotFound (no such scratch volume), errdefs.ErrNotImplemented (this backend
	// or this volume's medium cannot be captured here).
	CaptureVolume(ctx context.Context, id, volume string) (VolumeCapture, error)
}

// LiveCapturer is implemented by VolumeCapturers that capture only a running sandbox
// (the Kubernetes backend: an emptyDir goes with the Pod's end, and the archive is read
// through the sandbox's agent). The runner captures a delete's volumes before it stops
// such a sandbox, not after, and the backend keeps the sandbox until the captures are
// closed.
type LiveCapturer interface {
	CapturesLive() bool
}

// StoppedGlobalCapturer is implemented by LiveCapturers that still capture a GLOBAL
// volume writer's copy (Volume.Global, CommitGeneration > 0) once the sandbox's
// workload has stopped, until Destroy: the Kubernetes backend, whose Pod outlives its
// workload for that. The runner commits such a writer as on any other backend (after
// Wait, before Destroy); the archive is made in the sandbox's Pod, so the runner checks
// it before it commits it.
type StoppedGlobalCapturer interface {
	CapturesStoppedGlobals() bool
}

// VolumeCapture is a captured volume, held until Close.
type VolumeCapture interface {
	// Pause is how long the sandbox's workload was paused (frozen) for the capture.
	Pause() time.Duration
	// WriteArchive writes the captured content to w in the fsarchive format and returns
	// the archive's statistics. It may be called once.
	WriteArchive(ctx context.Context, w io.Writer) (ArchiveStats, error)
	// Close releases the capture (idempotent).
	Close() error
}

// ArchiveStats describes a written or extracted archive.
type ArchiveStats struct {
	Files int64 // entries (files, directories, symlinks)
	Bytes int64 // sum of regular files' sizes (before compression)
	// Skipped counts what Write left out: device nodes, fifos, sockets, and entries that
	// vanished while the tree was read. Extract never skips (it refuses).
	Skipped int64
}

// SnapshotCache is implemented by backends that restore volumes from snapshot archives.
type SnapshotCache interface {
	// PrepareSnapshot makes the archive with hex sha256 digest ready for Volume.RestoreDigest.
	// open is called only when the backend does not have it yet; its reader must fail
	// (not return io.EOF) when the content does not match digest (blob.Store.Get does),
	// and nothing of a failed or mismatching archive is kept. limits bound what the
	// archive may hold. Concurrent calls for one digest download it once.
	PrepareSnapshot(ctx context.Context, digest string, limits ArchiveLimits, open func(context.Context) (io.ReadCloser, error)) error
	// CachedSnapshots lists the digests PrepareSnapshot has ready (most recently used
	// first, at most max).
	CachedSnapshots(max int) []string
}

// ArchiveLimits bound an archive being extracted (a snapshot is sandbox-made content).
type ArchiveLimits struct {
	MaxBytes int64 // sum of regular files' sizes; 0 = no limit
	MaxFiles int64 // entries; 0 = no limit
}
