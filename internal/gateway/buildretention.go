package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/blob"
)

// Build retention (docs/builds.md, "Retention"): builds and their log events are deleted
// once ended and older than BuildOptions.Retention, and beyond BuildOptions.Keep ended
// builds per organization (the oldest first). Queued and running builds are never
// deleted. Every gateway replica on a store may sweep: deleting is idempotent.

const (
	// DefaultBuildRetention and DefaultBuildKeep are sandboxd's flag defaults
	// (--build-retention, --build-keep).
	DefaultBuildRetention = 30 * 24 * time.Hour
	DefaultBuildKeep      = 1000
	// DefaultBuildSweepInterval is BuildOptions.SweepInterval's default.
	DefaultBuildSweepInterval = 10 * time.Minute
	// buildSweepBatch is how many builds one store call deletes.
	buildSweepBatch = 500
)

var endedBuildStates = []int32{int32(buildv1.BuildState_BUILD_STATE_SUCCEEDED), int32(buildv1.BuildState_BUILD_STATE_FAILED), int32(buildv1.BuildState_BUILD_STATE_CANCELLED)}

// sweepLoop sweeps at start and every SweepInterval until ctx is done (nothing when
// neither Retention nor Keep is set, or SweepInterval is negative).
func (bs *buildService) sweepLoop(ctx context.Context) {
	if (bs.cfg.Retention <= 0 && bs.cfg.Keep <= 0) || bs.cfg.SweepInterval < 0 {
		return
	}
	t := time.NewTicker(bs.cfg.SweepInterval)
	defer t.Stop()
	for {
		n, err := bs.sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			bs.s.log.Warn("build retention: sweep failed", "err", err, "deleted", n)
		case n > 0:
			bs.s.log.Info("build retention: deleted ended builds", "builds", n, "retention", bs.cfg.Retention, "keep", bs.cfg.Keep)
		}
		if n, err := bs.sweepContexts(ctx); err != nil && ctx.Err() == nil {
			bs.s.log.Warn("build retention: build context sweep failed", "err", err, "deleted", n)
		} else if n > 0 {
			bs.s.log.Info("build retention: deleted build contexts", "objects", n, "retention", bs.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep deletes the ended builds that are due, in batches, and says how many.
func (bs *buildService) sweep(ctx context.Context) (int, error) {
	var before time.Time
	if bs.cfg.Retention > 0 {
		before = bs.cfg.Now().Add(-bs.cfg.Retention)
	}
	keep := max(bs.cfg.Keep, 0)
	total := 0
	for {
		n, err := bs.st.DeleteEnded(ctx, endedBuildStates, before, keep, buildSweepBatch)
		total += n
		if err != nil || n < buildSweepBatch {
			return total, err
		}
	}
}

// maxContextSweep bounds the objects one context sweep looks at.
const maxContextSweep = 10000

// sweepContexts deletes the uploaded build contexts (PUT /v1/buildContexts) last written
// more than Retention ago (none when Retention is 0): in the gateway's blob store, and in
// the own bucket of each organization whose build storage is CUSTOMER_OWNED (its prefix
// only).
func (bs *buildService) sweepContexts(ctx context.Context) (int, error) {
	if bs.cfg.Retention <= 0 {
		return 0, nil
	}
	n := 0
	if blobs := bs.s.blobs; blobs != nil {
		k, err := bs.sweepContextsIn(ctx, blobs, buildContextPrefix)
		if n += k; err != nil {
			return n, err
		}
	}
	if bs.s.orgs == nil || bs.cfg.Settings == nil {
		return n, nil
	}
	orgs, err := bs.s.orgs.List(ctx)
	if err != nil {
		return n, err
	}
	var errs []error
	for _, o := range orgs {
		c, err := bs.cfg.Settings.Get(ctx, o.ID)
		if err != nil || !customerOwned(c.Mode) {
			continue // none (ErrNotFound), or read again at the next sweep
		}
		st, _, _, err := bs.s.buildContextStore(ctx, o.ID)
		if err != nil {
			errs = append(errs, fmt.Errorf("build contexts of %s: %w", o.ID, err))
			continue
		}
		k, err := bs.sweepContextsIn(ctx, st, buildContextPrefix+orgKeyComponent(o.ID)+"/")
		n += k
		if err != nil {
			errs = append(errs, fmt.Errorf("build contexts of %s: %w", o.ID, err))
		}
	}
	return n, errors.Join(errs...)
}

// sweepContextsIn deletes the contexts under prefix of blobs older than the retention.
func (bs *buildService) sweepContextsIn(ctx context.Context, blobs blob.Store, prefix string) (int, error) {
	before := bs.cfg.Now().Add(-bs.cfg.Retention)
	var old []string
	seen := 0
	for info, err := range blobs.List(ctx, prefix) {
		if err != nil {
			return 0, err
		}
		if seen++; seen > maxContextSweep {
			break
		}
		if info.ModTime.Before(before) {
			old = append(old, info.Key)
		}
	}
	n := 0
	for _, key := range old {
		if err := blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
			return n, err
		}
		n++
	}
	return n, nil
}
