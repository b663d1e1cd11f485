// Package ckptspace decides whether a checkpoint image fits the space a checkpoint store
// may use: at most a quota of bytes for the store's images, and at least a minimum of
// free bytes left on the file system they are written to. The node agent's store
// (internal/nodeagent/store) and the local backend's checkpoints (internal/runtime/local)
// both admit a checkpoint with Admit before it is written, counting the images they hold
// and the estimates of the checkpoints in flight (written now, not yet seen by statfs).
package ckptspace

import (
	"errors"
	"sync"
	"syscall"
)

// Limits bound a checkpoint store.
type Limits struct {
	// QuotaBytes bounds the store's images (complete ones and checkpoints in flight);
	// 0: no bound.
	QuotaBytes int64
	// MinFreeBytes is what a checkpoint must leave free on the images' file system
	// after the checkpoints in flight (0: the estimates must fit the free space).
	MinFreeBytes int64
}

// Validate checks that neither limit is negative.
func (l Limits) Validate() error {
	if l.QuotaBytes < 0 || l.MinFreeBytes < 0 {
		return errors.New("checkpoint space limits must not be negative")
	}
	return nil
}

// Verdict is Admit's answer.
type Verdict int

const (
	// Fits: the checkpoint may be written.
	Fits Verdict = iota
	// OverQuota: the store's images and checkpoints in flight with this one would exceed
	// QuotaBytes.
	OverQuota
	// UnderMinFree: the file system would have less than MinFreeBytes free once the
	// checkpoints in flight and this one are written.
	UnderMinFree
)

// Admit says whether a checkpoint of estimate bytes fits: used is the bytes of the
// store's images and checkpoints in flight (their estimates), inFlight the part of used
// still being written (free does not show it yet), free the free bytes of the images'
// file system now. The sums saturate (no overflow from huge values).
func (l Limits) Admit(used, inFlight, free, estimate int64) Verdict {
	if l.QuotaBytes > 0 && add(used, estimate) > l.QuotaBytes {
		return OverQuota
	}
	if free-add(inFlight, estimate) < l.MinFreeBytes {
		return UnderMinFree
	}
	return Fits
}

// OverQuota reports whether images of total bytes exceed the quota.
func (l Limits) OverQuota(total int64) bool { return l.QuotaBytes > 0 && total > l.QuotaBytes }

// add is a+b for non-negative a and b, saturating at the largest int64 (negatives count as 0).
func add(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > 1<<63-1-b {
		return 1<<63 - 1
	}
	return a + b
}

// StatfsFree is the bytes available to unprivileged users on path's file system.
func StatfsFree(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Gate admits checkpoints against Limits for a store whose complete images are counted
// by the caller (used, read under the gate's lock), and holds the estimates of the
// checkpoints it admitted until they are released, so that concurrent checkpoints
// together stay within the limits.
type Gate struct {
	Limits
	// Free reports the free bytes of the images' file system; nil: free space is not
	// checked (MinFreeBytes is ignored).
	Free func() (int64, error)

	mu       sync.Mutex
	inFlight int64
}

// Reserve admits a checkpoint of estimate bytes given used, the bytes of the store's
// complete images (called under the gate's lock: reserving and counting do not race).
// When it fits, its estimate is held until release is called (once; later calls do
// nothing): the caller releases it once the image is counted by used, or removed.
// Otherwise the verdict says which limit refused it (release is nil), or err says the
// free space could not be read.
func (g *Gate) Reserve(used func() int64, estimate int64) (release func(), v Verdict, err error) {
	estimate = max(estimate, 0)
	g.mu.Lock()
	defer g.mu.Unlock()
	free := int64(1<<63 - 1)
	if g.Free != nil {
		if free, err = g.Free(); err != nil {
			return nil, Fits, err
		}
	}
	var u int64
	if g.QuotaBytes > 0 {
		u = used()
	}
	if v := g.Admit(add(u, g.inFlight), g.inFlight, free, estimate); v != Fits {
		return nil, v, nil
	}
	g.inFlight += estimate
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.inFlight -= estimate
			g.mu.Unlock()
		})
	}, Fits, nil
}

// InFlight is the bytes reserved by checkpoints admitted and not released.
func (g *Gate) InFlight() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}
