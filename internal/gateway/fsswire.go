package gateway

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// wireSnapshots plugs the snapshot limits (fsslimits.go), the organizations' buckets
// (settings_fss.go), the placement preference for cached snapshots and the garbage
// collector (fssgc.go) into the snapshot core (snapshots.go). Without an index and a
// blob store there are no snapshots and nothing to wire.
func (s *Server) wireSnapshots(ctx context.Context, cfg Config) {
	if s.snaps == nil || s.blobs == nil {
		return
	}
	if s.snapBucket != "" {
		s.fss.PlatformBucket = s.snapBucket
	} else {
		s.snapBucket = s.fss.PlatformBucket
	}
	usage := UsageFunc(s.snaps.SnapshotUsage)
	s.hooks.admit = func(ctx context.Context, org, sandboxID string, n int, onDelete bool) (int64, error) {
		// The organization's quota (max_snapshots, max_snapshot_bytes) over the flags.
		limits, zero, err := s.orgSnapshotLimits(ctx, org)
		if err != nil {
			return 0, err
		}
		if zero != "" {
			return 0, apierr.New(apierr.FSSQuotaExceeded, "the organization's quota allows no file-system snapshots (max_"+map[string]string{"snapshots": "snapshots", "bytes": "snapshot_bytes"}[zero]+" is 0)",
				map[string]string{"quota": zero, "limit": "0", "current": "0"})
		}
		if onDelete {
			return checkSnapshotOnDeleteAdmission(ctx, usage, org, n, limits)
		}
		inFlight, _, err := s.snaps.List(ctx, org, store.SnapshotFilter{SourceSandboxID: sandboxID, States: []string{store.SnapshotCreating}}, store.Page{Size: store.MaxPageSize})
		if err != nil {
			return 0, apierr.WithRetry(apierr.New(apierr.BackendUnavailable, "the snapshot index cannot be read now", nil), 0)
		}
		return checkSnapshotAdmission(ctx, usage, org, len(inFlight), limits)
	}
	s.hooks.prefer = func(ctx context.Context, cands []placement.Candidate, srcs []runner.SnapshotSource) []placement.Candidate {
		digests := make([]string, 0, len(srcs))
		for _, src := range srcs {
			digests = append(digests, src.Digest)
		}
		placement.PreferCached(cands, s.views.snapshot(ctx), digests)
		return cands
	}
	gc := newFSSGC(s.blobs, s.snaps.SnapshotKeyExists, s.fss.GC, s.log)
	s.loops.Go(func() { gc.run(ctx) })
}
