package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/store"
)

// fssFlags are the gateway's file-system snapshot limits and garbage collector
// (`sandboxd gateway` and `sandboxd dev`).
type fssFlags struct {
	maxPerOrg, maxInFlight           int
	maxBytesPerOrg, maxSnapshotBytes string
	gcInterval, gcGrace              time.Duration
}

func (f *fssFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.maxPerOrg, "fss-max-per-org", gateway.DefaultFSSMaxPerOrg, "file-system snapshots an organization may hold")
	fs.StringVar(&f.maxBytesPerOrg, "fss-max-bytes-per-org", quantity.FormatMemory(gateway.DefaultFSSMaxBytesPerOrg), "bytes of snapshot archives an organization may hold")
	fs.StringVar(&f.maxSnapshotBytes, "fss-max-snapshot-bytes", quantity.FormatMemory(gateway.DefaultFSSMaxSnapshotBytes), "largest archive of one snapshot (larger fails CWSANDBOX_FSS_SIZE_EXCEEDED)")
	fs.IntVar(&f.maxInFlight, "fss-max-in-flight-per-sandbox", gateway.DefaultFSSMaxInFlightPerSandbox, "snapshots of one sandbox being taken at once")
	fs.DurationVar(&f.gcInterval, "fss-gc-interval", gateway.DefaultFSSGCInterval, "how often snapshot archives with no index row are looked for (negative: never)")
	fs.DurationVar(&f.gcGrace, "fss-gc-grace", gateway.DefaultFSSGCGrace, "age below which an archive with no index row is kept (an upload whose row is on its way)")
}

// options are the gateway's FSSOptions of the flags and the store (the organizations'
// snapshot buckets). The platform bucket and its prober come from the blob store config
// (blobconfig.Config.Bucket, BucketProber).
func (f fssFlags) options(st store.Store) (gateway.FSSOptions, error) {
	perOrg, err := quantity.ParseMemory(f.maxBytesPerOrg)
	if err != nil {
		return gateway.FSSOptions{}, fmt.Errorf("--fss-max-bytes-per-org: %w", err)
	}
	perSnap, err := quantity.ParseMemory(f.maxSnapshotBytes)
	if err != nil {
		return gateway.FSSOptions{}, fmt.Errorf("--fss-max-snapshot-bytes: %w", err)
	}
	lim := gateway.SnapshotLimits{MaxPerOrg: f.maxPerOrg, MaxBytesPerOrg: perOrg, MaxSnapshotBytes: perSnap, MaxInFlightPerSandbox: f.maxInFlight}
	for name, v := range map[string]int64{"fss-max-per-org": int64(f.maxPerOrg), "fss-max-bytes-per-org": perOrg,
		"fss-max-snapshot-bytes": perSnap, "fss-max-in-flight-per-sandbox": int64(f.maxInFlight)} {
		if v <= 0 {
			return gateway.FSSOptions{}, fmt.Errorf("--%s: must be positive", name)
		}
	}
	if err := lim.Validate(); err != nil {
		return gateway.FSSOptions{}, fmt.Errorf("--fss-*: %w", err)
	}
	if f.gcGrace < time.Minute {
		return gateway.FSSOptions{}, fmt.Errorf("--fss-gc-grace %s: at least 1m", f.gcGrace)
	}
	if f.gcInterval == 0 {
		return gateway.FSSOptions{}, fmt.Errorf("--fss-gc-interval: 0 (negative disables the collector)")
	}
	opts := gateway.FSSOptions{Limits: lim, GC: gateway.FSSGCConfig{Interval: f.gcInterval, Grace: f.gcGrace}}
	if st != nil {
		opts.BucketConfigs = st.FSSBucketConfigs()
	}
	return opts, nil
}
