package local

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/ckptspace"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Checkpoint space (Config.CheckpointQuotaBytes, Config.CheckpointMinFreeBytes): the
// checkpoints this backend writes into its state dir are admitted before the sandbox is
// touched, as the node agent admits its own (internal/ckptspace):
//
//   - the estimate is the sandbox's memory as its cgroup counts it now (memory.current,
//     a group's every container's: the sentry's memory, the application's and the root
//     filesystem's writes held in runsc's overlay memory file, which is what the image
//     holds), else its memory limit, else defaultCheckpointEstimate; a fork's adds the
//     agent state dir it copies. Volumes are not copied (they stay, or are btrfs
//     snapshots for forks: copy-on-write).
//   - the images counted are the checkpoints of the paused sandboxes this backend holds
//     (their pause markers' measured size, kept current as sandboxes are paused,
//     resumed, stopped and recovered), plus the estimates of the checkpoints in flight
//     (held from admission until the image is counted, or removed on failure).
//   - a fork of a running sandbox takes one checkpoint for all its forks (removed once
//     they are made): it is counted once whatever its count; a fork of a checkpointed
//     sandbox restores from its checkpoint and writes none.
//
// A refusal is runtime.ErrCheckpointSpaceExhausted with a fixed message naming the
// limit; the sandbox is left as it was (running, or frozen).

// The refusals (fixed sentences naming the limit; the numbers are in the runner's log).
var (
	ErrCheckpointQuota   = fmt.Errorf("%w: the runner's checkpoint images would exceed its checkpoint quota (--checkpoint-quota-bytes)", runtime.ErrCheckpointSpaceExhausted)
	ErrCheckpointMinFree = fmt.Errorf("%w: the checkpoint would leave less free space on the runner's checkpoint file system than it keeps (--checkpoint-min-free-bytes)", runtime.ErrCheckpointSpaceExhausted)
)

// defaultCheckpointEstimate is the estimate of a sandbox whose memory is unknown (no
// cgroup reading, no memory limit), as the node agent's default.
const defaultCheckpointEstimate = 1 << 30

// newCheckpointGate is the gate of cfg's limits; nil when neither is set.
func newCheckpointGate(cfg Config) (*ckptspace.Gate, error) {
	l := ckptspace.Limits{QuotaBytes: cfg.CheckpointQuotaBytes, MinFreeBytes: cfg.CheckpointMinFreeBytes}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	if l == (ckptspace.Limits{}) {
		return nil, nil
	}
	dir := cfg.StateDir
	return &ckptspace.Gate{Limits: l, Free: func() (int64, error) { return ckptspace.StatfsFree(dir) }}, nil
}

// checkpointImageBytes is the bytes of the checkpoints of the paused sandboxes held.
func (b *Backend) checkpointImageBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, s := range b.sandboxes {
		if m := s.paused; m != nil && m.Released {
			n += m.Bytes
		}
	}
	return n
}

// CheckpointBytes is the bytes of the checkpoint images this backend holds (paused
// sandboxes') and the estimates of the checkpoints being written.
func (b *Backend) CheckpointBytes() (images, inFlight int64) {
	images = b.checkpointImageBytes()
	if b.ckpt != nil {
		inFlight = b.ckpt.InFlight()
	}
	return images, inFlight
}

// checkpointEstimate is what a checkpoint of running sandbox s is expected to take; fork
// adds the agent state dir a fork's checkpoint copies.
func (b *Backend) checkpointEstimate(s *sandbox, fork bool) int64 {
	est := int64(0)
	if u, err := b.Usage(s.id); err == nil {
		est = u.MemoryBytes
	}
	if est <= 0 {
		est = s.spec.TotalResources().MemoryBytes
	}
	if est <= 0 {
		est = defaultCheckpointEstimate
	}
	if fork {
		est += dirBytes(filepath.Join(shownDir(s.dir), dirRun))
	}
	return est
}

// reserveCheckpoint admits a checkpoint of running sandbox s (a pause's, or a fork's
// when fork) before anything of s is touched; release gives its estimate back (once the
// image is counted as a paused sandbox's, or removed). The error wraps
// runtime.ErrCheckpointSpaceExhausted when a limit refuses it.
func (b *Backend) reserveCheckpoint(s *sandbox, fork bool) (release func(), err error) {
	if b.ckpt == nil {
		return func() {}, nil
	}
	est := b.checkpointEstimate(s, fork)
	release, v, err := b.ckpt.Reserve(b.checkpointImageBytes, est)
	if err != nil {
		b.log.Warn("checkpoint: free space of the state dir", "sandbox", s.id, "err", err)
		return nil, errors.New("the free space of the runner's checkpoint file system cannot be read")
	}
	switch v {
	case ckptspace.OverQuota:
		b.log.Info("checkpoint refused: over the checkpoint quota", "sandbox", s.id, "estimate", est, "quota", b.ckpt.QuotaBytes)
		return nil, ErrCheckpointQuota
	case ckptspace.UnderMinFree:
		b.log.Info("checkpoint refused: too little free space", "sandbox", s.id, "estimate", est, "min_free", b.ckpt.MinFreeBytes)
		return nil, ErrCheckpointMinFree
	}
	return release, nil
}
