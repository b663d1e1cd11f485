package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// File-system snapshot limits (issue 20). The gateway admits a new snapshot against the
// organization's quota (count and bytes of its snapshots) and the sandbox's snapshots in
// flight, and bounds each archive with the size the runner enforces
// (runner.SnapshotTarget.MaxSizeBytes: a larger archive fails with
// CWSANDBOX_FSS_SIZE_EXCEEDED and is not kept).

// Defaults of SnapshotLimits (a zero field takes its default).
const (
	// DefaultFSSMaxPerOrg: snapshots an organization may hold (every index row that is
	// not being deleted: CREATING, READY and FAILED).
	DefaultFSSMaxPerOrg = 1000
	// DefaultFSSMaxBytesPerOrg: bytes of archives an organization may hold (1 TiB).
	DefaultFSSMaxBytesPerOrg int64 = 1 << 40
	// DefaultFSSMaxSnapshotBytes: the largest archive of one snapshot (50 GiB).
	DefaultFSSMaxSnapshotBytes int64 = 50 << 30
	// DefaultFSSMaxInFlightPerSandbox: snapshots of one sandbox in state CREATING at once.
	DefaultFSSMaxInFlightPerSandbox = 2
)

// Upper bounds of what SnapshotLimits may configure (Validate): a typo must not lift a
// limit out of sight.
const (
	maxFSSMaxPerOrg             = 1_000_000
	maxFSSMaxBytes              = 1 << 50 // 1 PiB
	maxFSSMaxInFlightPerSandbox = 64
)

// fssInflightRetry is the RetryInfo delay of CWSANDBOX_FSS_INFLIGHT_LIMIT: about the
// time a snapshot of a small volume takes.
const fssInflightRetry = 2 * time.Second

// SnapshotLimits bound file-system snapshots. A zero field means its default
// (DefaultFSS*); a negative one is invalid. There is no "unlimited".
type SnapshotLimits struct {
	// MaxPerOrg: snapshots one organization may hold.
	MaxPerOrg int
	// MaxBytesPerOrg: bytes of archives one organization may hold.
	MaxBytesPerOrg int64
	// MaxSnapshotBytes: the largest archive of one snapshot (at most MaxBytesPerOrg).
	MaxSnapshotBytes int64
	// MaxInFlightPerSandbox: snapshots of one sandbox being taken at once.
	MaxInFlightPerSandbox int
}

// WithDefaults returns l with every zero field set to its default.
func (l SnapshotLimits) WithDefaults() SnapshotLimits {
	if l.MaxPerOrg == 0 {
		l.MaxPerOrg = DefaultFSSMaxPerOrg
	}
	if l.MaxBytesPerOrg == 0 {
		l.MaxBytesPerOrg = DefaultFSSMaxBytesPerOrg
	}
	if l.MaxSnapshotBytes == 0 {
		l.MaxSnapshotBytes = min(DefaultFSSMaxSnapshotBytes, l.MaxBytesPerOrg)
	}
	if l.MaxInFlightPerSandbox == 0 {
		l.MaxInFlightPerSandbox = DefaultFSSMaxInFlightPerSandbox
	}
	return l
}

// Validate reports the first thing wrong with l (after defaults), naming the field as
// its flag does (--fss-…). It is pure.
func (l SnapshotLimits) Validate() error {
	if l.MaxPerOrg < 0 || l.MaxBytesPerOrg < 0 || l.MaxSnapshotBytes < 0 || l.MaxInFlightPerSandbox < 0 {
		return errors.New("fss limits: a limit is negative (0 means the default)")
	}
	l = l.WithDefaults()
	switch {
	case l.MaxPerOrg > maxFSSMaxPerOrg:
		return fmt.Errorf("fss limits: max per org %d: at most %d", l.MaxPerOrg, maxFSSMaxPerOrg)
	case l.MaxBytesPerOrg > maxFSSMaxBytes:
		return fmt.Errorf("fss limits: max bytes per org %d: at most %d (1 PiB)", l.MaxBytesPerOrg, int64(maxFSSMaxBytes))
	case l.MaxSnapshotBytes > l.MaxBytesPerOrg:
		return fmt.Errorf("fss limits: max snapshot bytes %d: more than max bytes per org %d", l.MaxSnapshotBytes, l.MaxBytesPerOrg)
	case l.MaxInFlightPerSandbox > maxFSSMaxInFlightPerSandbox:
		return fmt.Errorf("fss limits: max in flight per sandbox %d: at most %d", l.MaxInFlightPerSandbox, maxFSSMaxInFlightPerSandbox)
	}
	return nil
}

// UsageFunc reports an organization's snapshots: how many it holds (every index row not
// being deleted) and the bytes of their archives (size_bytes of READY ones; CREATING
// rows count 0 bytes until they finish). The core's store implements it
// (SnapshotUsage).
type UsageFunc func(ctx context.Context, org string) (count int, bytes int64, err error)

// checkSnapshotAdmission admits one MANUAL snapshot (CreateFileSystemSnapshot) of a
// sandbox that has inFlight snapshots in state CREATING, and returns the
// MaxSizeBytes to give the runner (runner.SnapshotTarget.MaxSizeBytes): the smaller of
// MaxSnapshotBytes and what is left of the organization's bytes quota, so an archive
// that would overrun the quota fails CWSANDBOX_FSS_SIZE_EXCEEDED on the runner. (Snapshots
// in flight at once may each use what is left: the quota can be overrun by at most the
// archives in flight.) Errors:
//   - inFlight >= MaxInFlightPerSandbox: UNAVAILABLE CWSANDBOX_FSS_INFLIGHT_LIMIT with
//     RetryInfo (the official clients retry it), metadata limit, current;
//   - count >= MaxPerOrg, or bytes >= MaxBytesPerOrg: RESOURCE_EXHAUSTED
//     CWSANDBOX_FSS_QUOTA_EXCEEDED, metadata quota ("snapshots" or "bytes"), limit,
//     current;
//   - usage fails: UNAVAILABLE CWSANDBOX_BACKEND_UNAVAILABLE with RetryInfo.
func checkSnapshotAdmission(ctx context.Context, usage UsageFunc, org string, inFlight int, limits SnapshotLimits) (maxBytes int64, err error) {
	limits = limits.WithDefaults()
	if inFlight >= limits.MaxInFlightPerSandbox {
		return 0, apierr.WithRetry(apierr.New(apierr.FSSInflightLimit,
			fmt.Sprintf("the sandbox has %d snapshots in flight, at most %d allowed: retry when one is READY or FAILED", inFlight, limits.MaxInFlightPerSandbox),
			map[string]string{"limit": strconv.Itoa(limits.MaxInFlightPerSandbox), "current": strconv.Itoa(inFlight)}), fssInflightRetry)
	}
	return checkSnapshotQuota(ctx, usage, org, 1, limits)
}

// checkSnapshotOnDeleteAdmission admits the n ON_DELETE snapshots of
// DeleteSandbox.snapshot_volumes: the organization's quota must leave room for all n
// (count) and bytes, as in checkSnapshotAdmission; the in-flight limit does not apply
// (the sandbox ends: nothing else will be taken of it). The caller refuses the whole
// request before terminating anything when this fails.
func checkSnapshotOnDeleteAdmission(ctx context.Context, usage UsageFunc, org string, n int, limits SnapshotLimits) (maxBytes int64, err error) {
	return checkSnapshotQuota(ctx, usage, org, max(n, 1), limits.WithDefaults())
}

func checkSnapshotQuota(ctx context.Context, usage UsageFunc, org string, n int, limits SnapshotLimits) (int64, error) {
	count, bytes, err := usage(ctx, org)
	if err != nil {
		return 0, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "reading the organization's snapshot usage: %v", err), 5*time.Second)
	}
	if count+n > limits.MaxPerOrg {
		return 0, apierr.New(apierr.FSSQuotaExceeded,
			fmt.Sprintf("the organization holds %d snapshots, at most %d allowed (this request adds %d): delete snapshots to make room", count, limits.MaxPerOrg, n),
			map[string]string{"quota": "snapshots", "limit": strconv.Itoa(limits.MaxPerOrg), "current": strconv.Itoa(count)})
	}
	if bytes >= limits.MaxBytesPerOrg {
		return 0, apierr.New(apierr.FSSQuotaExceeded,
			fmt.Sprintf("the organization's snapshots hold %d bytes, at most %d allowed: delete snapshots to make room", bytes, limits.MaxBytesPerOrg),
			map[string]string{"quota": "bytes", "limit": strconv.FormatInt(limits.MaxBytesPerOrg, 10), "current": strconv.FormatInt(bytes, 10)})
	}
	return min(limits.MaxSnapshotBytes, limits.MaxBytesPerOrg-max(bytes, 0)), nil
}
