package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// File-system snapshots: an immutable, organization-scoped archive of one scratch
// volume of a sandbox (see the package documentation).

// SnapshotState is a snapshot's lifecycle state.
type SnapshotState int32

// Snapshot states, numbered as in coreweave.sandbox.v1.SnapshotState.
const (
	SnapshotUnspecified SnapshotState = 0
	SnapshotCreating    SnapshotState = 1
	SnapshotReady       SnapshotState = 2
	SnapshotFailed      SnapshotState = 3
	SnapshotDeleting    SnapshotState = 4
)

// String is the state's name in lower case ("creating", "ready", …).
func (s SnapshotState) String() string {
	name, ok := sandboxv1.SnapshotState_name[int32(s)]
	if !ok {
		return fmt.Sprintf("snapshot_state(%d)", int32(s))
	}
	return strings.ToLower(strings.TrimPrefix(name, "SNAPSHOT_STATE_"))
}

// SnapshotTrigger is what took a snapshot.
type SnapshotTrigger int32

// Triggers, numbered as in coreweave.sandbox.v1.SnapshotTrigger.
const (
	TriggerUnspecified SnapshotTrigger = 0
	TriggerManual      SnapshotTrigger = 1 // Sandbox.Snapshot (CreateFileSystemSnapshot)
	TriggerOnDelete    SnapshotTrigger = 2 // StopWithSnapshots (DeleteSandbox.snapshot_volumes)
)

// String is the trigger's name in lower case ("manual", "on_delete").
func (t SnapshotTrigger) String() string {
	name, ok := sandboxv1.SnapshotTrigger_name[int32(t)]
	if !ok {
		return fmt.Sprintf("snapshot_trigger(%d)", int32(t))
	}
	return strings.ToLower(strings.TrimPrefix(name, "SNAPSHOT_TRIGGER_"))
}

// Snapshot is a file-system snapshot as last seen.
type Snapshot struct {
	ID     string
	State  SnapshotState
	Reason string // why it is in this state (e.g. what failed)
	// SizeBytes is the archive's size once READY.
	SizeBytes       int64
	SourceSandboxID string
	SourceVolume    string
	Trigger         SnapshotTrigger
	Bucket          string // the object bucket holding it
	RequestID       string
	CreatedAt       time.Time
	CompletedAt     time.Time // when it became READY or FAILED
	UpdatedAt       time.Time

	proto *sandboxv1.FileSystemSnapshot
}

// Proto returns the snapshot message received.
func (s *Snapshot) Proto() *sandboxv1.FileSystemSnapshot { return s.proto }

func snapshotFromProto(p *sandboxv1.FileSystemSnapshot) *Snapshot {
	s := &Snapshot{
		ID: p.GetFileSystemSnapshotId(), State: SnapshotState(p.GetState()), Reason: p.GetStateReason(),
		SizeBytes: p.GetSizeBytes(), SourceSandboxID: p.GetSourceSandboxId(), SourceVolume: p.GetSourceVolumeName(),
		Trigger: SnapshotTrigger(p.GetTrigger()), Bucket: p.GetObjectBucket(), RequestID: p.GetRequestId(), proto: p,
	}
	if t := p.GetCreateTime(); t != nil {
		s.CreatedAt = t.AsTime()
	}
	if t := p.GetCompleteTime(); t != nil {
		s.CompletedAt = t.AsTime()
	}
	if t := p.GetUpdatedAt(); t != nil {
		s.UpdatedAt = t.AsTime()
	}
	return s
}

// SnapshotError reports a snapshot that FAILED while the caller waited for it.
type SnapshotError struct {
	ID     string
	Reason string
}

func (e *SnapshotError) Error() string {
	msg := "snapshot " + e.ID + " failed"
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is matches ErrSnapshotFailed.
func (e *SnapshotError) Is(target error) bool { return target == ErrSnapshotFailed }

// ScratchVolume is a scratch volume of the sandbox, mounted at MountPath in the
// single container of a Spec (or, with Spec.Containers, where each Container.Mounts
// says). Only scratch volumes can be snapshotted.
type ScratchVolume struct {
	Name string // required: unique in the spec
	// Size bounds the volume, a Kubernetes quantity ("1Gi"); "" is the server's default.
	Size string
	// Memory backs the volume with memory (tmpfs) instead of disk.
	Memory bool
	// RestoreFrom is a READY snapshot's ID: the volume starts with its content.
	RestoreFrom string
	// MountPath is where a single-container Spec mounts it ("" = not mounted there).
	MountPath string
}

// Mount mounts a volume of Spec.Volumes in a Container.
type Mount struct {
	Volume   string
	Path     string
	ReadOnly bool
}

func (v ScratchVolume) proto() *sandboxv1.SandboxVolume {
	sc := &sandboxv1.ScratchVolume{Size: v.Size, RestoreFromSnapshotId: v.RestoreFrom}
	if v.Memory {
		sc.Medium = sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY
	}
	return &sandboxv1.SandboxVolume{Name: v.Name, Source: &sandboxv1.SandboxVolume_Scratch{Scratch: sc}}
}

func mountsProto(ms []Mount) []*sandboxv1.VolumeMount {
	var out []*sandboxv1.VolumeMount
	for _, m := range ms {
		out = append(out, &sandboxv1.VolumeMount{Volume: m.Volume, MountPath: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}

// validateVolumes checks names, and that MountPath is only used where it means
// something (a single-container spec) and mounts name declared volumes.
func (s Spec) validateVolumes() error {
	seen := map[string]bool{}
	for i, v := range s.Volumes {
		switch {
		case v.Name == "":
			return fmt.Errorf("sandbox: Volumes[%d]: Name is required", i)
		case seen[v.Name]:
			return fmt.Errorf("sandbox: volume name %q is used twice", v.Name)
		case v.MountPath != "" && len(s.Containers) > 0:
			return fmt.Errorf("sandbox: volume %q: MountPath is for a single-container Spec; use Container.Mounts", v.Name)
		}
		seen[v.Name] = true
	}
	for _, c := range s.Containers {
		for _, m := range c.Mounts {
			if !seen[m.Volume] {
				return fmt.Errorf("sandbox: container %q mounts volume %q, which Spec.Volumes does not declare", c.Name, m.Volume)
			}
			if m.Path == "" {
				return fmt.Errorf("sandbox: container %q: the mount of %q has no Path", c.Name, m.Volume)
			}
		}
	}
	return nil
}

// SnapshotOption configures Sandbox.Snapshot.
type SnapshotOption func(*snapshotConfig)

type snapshotConfig struct{ noWait bool }

// NoWait makes Snapshot return the snapshot as created (usually SnapshotCreating)
// instead of waiting until it is READY; WaitSnapshot waits later.
func NoWait() SnapshotOption { return func(c *snapshotConfig) { c.noWait = true } }

// Snapshot snapshots the scratch volume named volume ("" = the server's choice: the
// sandbox's only scratch volume) of the running sandbox and waits until the snapshot
// is READY (see NoWait). A snapshot that FAILED is a *SnapshotError (ErrSnapshotFailed).
// Transient failures are retried with the same request ID, so a retry never takes a
// second snapshot.
func (s *Sandbox) Snapshot(ctx context.Context, volume string, opts ...SnapshotOption) (*Snapshot, error) {
	var cfg snapshotConfig
	for _, o := range opts {
		o(&cfg)
	}
	req := &sandboxv1.CreateFileSystemSnapshotRequest{SandboxId: s.id, ScratchVolumeName: volume, RequestId: newUUID()}
	var snap *Snapshot
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := s.c.svc.CreateFileSystemSnapshot(cctx, connect.NewRequest(req))
		if err != nil {
			return fromRPC(err)
		}
		snap = snapshotFromProto(res.Msg)
		return nil
	})
	if err != nil || cfg.noWait {
		return snap, err
	}
	return s.c.WaitSnapshot(ctx, snap.ID)
}

// WaitSnapshot polls the snapshot id until it is READY and returns it then; one that
// FAILED is a *SnapshotError. Without a deadline on ctx it gives up after 5 minutes.
func (c *Client) WaitSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, waitTimeout)
		defer cancel()
	}
	b := newPollBackoff()
	for {
		var snap *Snapshot
		err := retry(ctx, retryBudget, func(ctx context.Context) error {
			var err error
			snap, err = c.GetSnapshot(ctx, id)
			return err
		})
		if err != nil {
			return nil, err
		}
		switch snap.State {
		case SnapshotReady:
			return snap, nil
		case SnapshotFailed, SnapshotDeleting:
			reason := snap.Reason
			if snap.State == SnapshotDeleting && reason == "" {
				reason = "it is being deleted"
			}
			return snap, &SnapshotError{ID: id, Reason: reason}
		}
		if err := sleep(ctx, b.next()); err != nil {
			return snap, fmt.Errorf("snapshot %s is not ready (still %s): %w", id, snap.State, waitErr(err))
		}
	}
}

// GetSnapshot returns the snapshot id of the caller's organization.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	cctx, cancel := withTimeout(ctx, getTimeout)
	defer cancel()
	res, err := c.svc.GetFileSystemSnapshot(cctx, connect.NewRequest(&sandboxv1.GetFileSystemSnapshotRequest{FileSystemSnapshotId: id}))
	if err != nil {
		return nil, fromRPC(err)
	}
	return snapshotFromProto(res.Msg), nil
}

// SnapshotListOptions filter ListSnapshots.
type SnapshotListOptions struct {
	SourceSandboxID string // only snapshots of this sandbox
	PageSize        int32  // 0 = server default
}

// ListSnapshots returns the organization's snapshots, following page tokens.
func (c *Client) ListSnapshots(ctx context.Context, opts SnapshotListOptions) ([]*Snapshot, error) {
	ctx, cancel := withTimeout(ctx, listTimeout)
	defer cancel()
	items, err := collectPages(ctx, maxListPages, func(ctx context.Context, token string) ([]*sandboxv1.FileSystemSnapshot, string, error) {
		var res *connect.Response[sandboxv1.ListFileSystemSnapshotsResponse]
		err := retry(ctx, retryBudget, func(ctx context.Context) error {
			var err error
			res, err = c.svc.ListFileSystemSnapshots(ctx, connect.NewRequest(&sandboxv1.ListFileSystemSnapshotsRequest{
				PageSize: opts.PageSize, PageToken: token, SourceSandboxId: opts.SourceSandboxID,
			}))
			return fromRPC(err)
		})
		if err != nil {
			return nil, "", err
		}
		return res.Msg.GetFileSystemSnapshots(), res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Snapshot, len(items))
	for i, p := range items {
		out[i] = snapshotFromProto(p)
	}
	return out, nil
}

// DeleteSnapshot deletes the snapshot id and its archive. A missing snapshot is
// ErrSnapshotNotFound unless allowMissing (or a retry finds it gone: an earlier attempt
// whose answer was lost deleted it). Sandboxes already restored from it keep their data.
func (c *Client) DeleteSnapshot(ctx context.Context, id string, allowMissing bool) error {
	attempts := 0
	return retry(ctx, retryBudget, func(ctx context.Context) error {
		attempts++
		cctx, cancel := withTimeout(ctx, deleteTimeout)
		defer cancel()
		_, err := c.svc.DeleteFileSystemSnapshot(cctx, connect.NewRequest(&sandboxv1.DeleteFileSystemSnapshotRequest{
			FileSystemSnapshotId: id, AllowMissing: allowMissing,
		}))
		err = fromRPC(err)
		if err != nil && (allowMissing || attempts > 1) && errors.Is(err, ErrSnapshotNotFound) {
			return nil
		}
		return err
	})
}

// StopWithSnapshots is Stop that first snapshots the named scratch volumes
// (DeleteSandbox.snapshot_volumes) and returns one snapshot ID per volume, in order.
// The sandbox ends whatever happens to the snapshots: wait for them with WaitSnapshot.
func (s *Sandbox) StopWithSnapshots(ctx context.Context, grace time.Duration, volumes []string) ([]string, error) {
	return s.stop(ctx, grace, volumes)
}

// Stop deletes the sandbox, giving its main command grace to exit after SIGTERM, then
// polls until it is COMPLETED, FAILED or TERMINATED.
func (s *Sandbox) Stop(ctx context.Context, grace time.Duration) error {
	_, err := s.stop(ctx, grace, nil)
	return err
}

func (s *Sandbox) stop(ctx context.Context, grace time.Duration, volumes []string) ([]string, error) {
	secs := int32(min(math.Ceil(grace.Seconds()), math.MaxInt32))
	budget := time.Duration(secs)*time.Second + 10*time.Second
	if len(volumes) > 0 {
		budget += createTimeout // the runner captures the volumes before it tears down
	}
	cctx, cancel := withTimeout(ctx, budget)
	res, err := s.c.svc.DeleteSandbox(cctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{
		SandboxId: s.id, GracePeriodSeconds: secs, SnapshotVolumes: volumes,
	}))
	cancel()
	if err != nil {
		return nil, fromRPC(err)
	}
	ids := res.Msg.GetFileSystemSnapshotIds()
	s.set(res.Msg.GetSandbox())
	if err := s.waitEnded(ctx, secs); err != nil {
		return ids, err
	}
	if len(ids) != len(volumes) {
		return ids, fmt.Errorf("sandbox %s: asked for %d snapshots, the server returned %d IDs", s.id, len(volumes), len(ids))
	}
	return ids, nil
}
