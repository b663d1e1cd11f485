package gateway

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
)

// The snapshot garbage collector (issue 20) removes archives that no snapshot index row
// names: left by a snapshot whose row was deleted while its object's delete failed, by a
// gateway that crashed between the two, or by anything else that wrote under fss/. The
// index is the truth: a row is inserted before its upload starts and deleted after its
// object, so an object with no row is garbage; the grace keeps the collector off an object
// whose row a racing create has only just inserted (or a listing that is behind).

// Defaults of FSSGCConfig.
const (
	DefaultFSSGCInterval   = 10 * time.Minute
	DefaultFSSGCGrace      = time.Hour
	DefaultFSSGCMaxPerPass = 1000
)

// fssPrefix is where snapshot archives live: fss/<organization-id>/<snapshot-id>.tar.zst.
const (
	fssPrefix    = "fss/"
	fssKeySuffix = ".tar.zst"
)

// FSSGCConfig configures the snapshot garbage collector.
type FSSGCConfig struct {
	// Interval between passes: 0 means DefaultFSSGCInterval, negative disables the
	// collector.
	Interval time.Duration
	// Grace: an object younger than this is never deleted (0: DefaultFSSGCGrace; at
	// least a minute).
	Grace time.Duration
	// MaxPerPass bounds the objects one pass looks up in the index (and so deletes); the
	// next pass goes on after the last one looked at (0: DefaultFSSGCMaxPerPass).
	MaxPerPass int
}

func (c FSSGCConfig) withDefaults() FSSGCConfig {
	if c.Interval == 0 {
		c.Interval = DefaultFSSGCInterval
	}
	if c.Grace == 0 {
		c.Grace = DefaultFSSGCGrace
	}
	c.Grace = max(c.Grace, time.Minute)
	if c.MaxPerPass <= 0 {
		c.MaxPerPass = DefaultFSSGCMaxPerPass
	}
	return c
}

// SnapshotExistsFunc reports whether the snapshot index has a row naming the object key,
// in any state and any organization (store.Snapshots.SnapshotKeyExists). An error means
// "cannot tell": the object is kept.
type SnapshotExistsFunc func(ctx context.Context, key string) (bool, error)

// blobLister is the part of blob.Store the collector uses (a blob.Store is one).
type blobLister interface {
	List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error]
	Delete(ctx context.Context, key string) error
}

// fssGC is the collector; one goroutine runs its passes.
type fssGC struct {
	blobs  blobLister
	exists SnapshotExistsFunc
	cfg    FSSGCConfig
	log    *slog.Logger
	now    func() time.Time
	// after is the last key the previous pass looked up; the next pass starts after it
	// ("" from the start).
	after string
}

func newFSSGC(blobs blobLister, exists SnapshotExistsFunc, cfg FSSGCConfig, log *slog.Logger) *fssGC {
	if log == nil {
		log = slog.Default()
	}
	return &fssGC{blobs: blobs, exists: exists, cfg: cfg.withDefaults(), log: log, now: time.Now}
}

// parseFSSKey returns the organization and snapshot ID of a snapshot archive's key, ok
// false for any other key under fss/.
func parseFSSKey(key string) (org, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, fssPrefix)
	if !ok {
		return "", "", false
	}
	org, name, ok := strings.Cut(rest, "/")
	if !ok || org == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	id, ok = strings.CutSuffix(name, fssKeySuffix)
	if !ok || id == "" {
		return "", "", false
	}
	return org, id, true
}

// pass looks at up to MaxPerPass objects under fss/ older than the grace, after the
// previous pass's last, and deletes each whose key is not a snapshot archive's or whose
// snapshot has no index row. It returns how many it deleted; a List error ends the pass
// (returned; the next pass starts over).
func (g *fssGC) pass(ctx context.Context) (deleted int, err error) {
	var (
		garbage []blob.Info
		looked  int
		last    string
		cutoff  = g.now().Add(-g.cfg.Grace)
	)
	// Collect first, delete after the listing: a store's listing need not survive
	// deletes under it.
	for info, lerr := range g.blobs.List(ctx, fssPrefix) {
		if lerr != nil {
			g.after = ""
			return 0, lerr
		}
		if info.Key <= g.after {
			continue
		}
		if looked == g.cfg.MaxPerPass {
			break
		}
		looked++
		last = info.Key
		if info.ModTime.After(cutoff) {
			continue // young: its row may be on its way
		}
		if _, _, ok := parseFSSKey(info.Key); ok {
			known, xerr := g.exists(ctx, info.Key)
			if xerr != nil {
				if ctx.Err() != nil {
					return deleted, ctx.Err()
				}
				g.log.Warn("fss gc: index lookup failed; keeping the object", "key", info.Key, "err", xerr)
				continue
			}
			if known {
				continue
			}
		}
		garbage = append(garbage, info)
	}
	if looked < g.cfg.MaxPerPass {
		g.after = "" // reached the end: the next pass starts over
	} else {
		g.after = last
	}
	for _, info := range garbage {
		_, _, parsed := parseFSSKey(info.Key)
		err := g.blobs.Delete(ctx, info.Key)
		switch {
		case errors.Is(err, blob.ErrNotFound):
			continue
		case err != nil:
			if ctx.Err() != nil {
				return deleted, ctx.Err()
			}
			g.log.Warn("fss gc: delete failed", "key", info.Key, "err", err)
			continue
		}
		deleted++
		why := "no snapshot index row"
		if !parsed {
			why = "not a snapshot archive key"
		}
		g.log.Info("fss gc: deleted an object", "key", info.Key, "size", info.Size, "modified", info.ModTime.UTC(), "why", why)
	}
	return deleted, nil
}

// run runs a pass every Interval until ctx ends (nothing with a negative Interval).
func (g *fssGC) run(ctx context.Context) {
	if g.cfg.Interval < 0 {
		return
	}
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := g.pass(ctx); err != nil && ctx.Err() == nil {
				g.log.Warn("fss gc: pass failed", "err", err)
			}
		}
	}
}
