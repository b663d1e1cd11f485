package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

func TestSnapshotLimitsDefaultsAndValidate(t *testing.T) {
	d := SnapshotLimits{}.WithDefaults()
	if d.MaxPerOrg != 1000 || d.MaxBytesPerOrg != 1<<40 || d.MaxSnapshotBytes != 50<<30 || d.MaxInFlightPerSandbox != 2 {
		t.Fatalf("defaults = %+v", d)
	}
	if err := (SnapshotLimits{}).Validate(); err != nil {
		t.Fatalf("zero limits (defaults): %v", err)
	}
	// A small bytes quota lowers the default per-snapshot maximum to it.
	if got := (SnapshotLimits{MaxBytesPerOrg: 1 << 30}).WithDefaults().MaxSnapshotBytes; got != 1<<30 {
		t.Errorf("default max snapshot bytes under a 1 GiB quota = %d", got)
	}
	for _, tc := range []struct {
		l    SnapshotLimits
		want string
	}{
		{SnapshotLimits{MaxPerOrg: -1}, "negative"},
		{SnapshotLimits{MaxInFlightPerSandbox: -3}, "negative"},
		{SnapshotLimits{MaxPerOrg: 2_000_000}, "max per org"},
		{SnapshotLimits{MaxBytesPerOrg: 1 << 51}, "max bytes per org"},
		{SnapshotLimits{MaxBytesPerOrg: 10 << 30, MaxSnapshotBytes: 20 << 30}, "max snapshot bytes"},
		{SnapshotLimits{MaxInFlightPerSandbox: 65}, "in flight"},
	} {
		err := tc.l.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error about %q", tc.l, err, tc.want)
		}
	}
}

func usageOf(count int, bytes int64, err error) UsageFunc {
	return func(_ context.Context, org string) (int, int64, error) {
		if org != "acme" {
			return 0, 0, errors.New("wrong org " + org)
		}
		return count, bytes, err
	}
}

func TestCheckSnapshotAdmission(t *testing.T) {
	ctx := context.Background()
	lim := SnapshotLimits{MaxPerOrg: 3, MaxBytesPerOrg: 1000, MaxSnapshotBytes: 400, MaxInFlightPerSandbox: 2}

	// Room: the runner's bound is the per-snapshot maximum, or what is left of the quota.
	if got, err := checkSnapshotAdmission(ctx, usageOf(1, 100, nil), "acme", 1, lim); err != nil || got != 400 {
		t.Fatalf("admit = %d, %v; want 400", got, err)
	}
	if got, err := checkSnapshotAdmission(ctx, usageOf(2, 900, nil), "acme", 0, lim); err != nil || got != 100 {
		t.Fatalf("admit near the bytes quota = %d, %v; want 100", got, err)
	}

	// In flight: UNAVAILABLE with RetryInfo, which the official client retries.
	_, err := checkSnapshotAdmission(ctx, usageOf(0, 0, nil), "acme", 2, lim)
	if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.FSSInflightLimit {
		t.Fatalf("in flight: %v", err)
	}
	if ri := apierr.RetryInfo(err); ri == nil || ri.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("in flight: no RetryInfo in %v", err)
	}
	if md := apierr.Info(err).GetMetadata(); md["limit"] != "2" || md["current"] != "2" {
		t.Errorf("in flight metadata = %v", md)
	}

	// Count quota.
	_, err = checkSnapshotAdmission(ctx, usageOf(3, 0, nil), "acme", 0, lim)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.FSSQuotaExceeded {
		t.Fatalf("count quota: %v", err)
	}
	if md := apierr.Info(err).GetMetadata(); md["quota"] != "snapshots" || md["limit"] != "3" || md["current"] != "3" {
		t.Errorf("count quota metadata = %v", md)
	}
	if apierr.RetryInfo(err) != nil {
		t.Errorf("count quota carries RetryInfo: waiting does not free a quota")
	}

	// Bytes quota.
	_, err = checkSnapshotAdmission(ctx, usageOf(1, 1000, nil), "acme", 0, lim)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.FSSQuotaExceeded {
		t.Fatalf("bytes quota: %v", err)
	}
	if md := apierr.Info(err).GetMetadata(); md["quota"] != "bytes" || md["limit"] != "1000" || md["current"] != "1000" {
		t.Errorf("bytes quota metadata = %v", md)
	}

	// The store is down: retryable, not a quota.
	_, err = checkSnapshotAdmission(ctx, usageOf(0, 0, errors.New("db down")), "acme", 0, lim)
	if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.BackendUnavailable {
		t.Fatalf("usage error: %v", err)
	}
	if ri := apierr.RetryInfo(err); ri == nil || ri.GetRetryDelay().AsDuration() < time.Second {
		t.Errorf("usage error: RetryInfo = %v", ri)
	}

	// Zero limits are the defaults: one snapshot fits an empty organization, bounded by 50 GiB.
	if got, err := checkSnapshotAdmission(ctx, usageOf(0, 0, nil), "acme", 0, SnapshotLimits{}); err != nil || got != 50<<30 {
		t.Fatalf("defaults: %d, %v", got, err)
	}
}

func TestCheckSnapshotOnDeleteAdmission(t *testing.T) {
	ctx := context.Background()
	lim := SnapshotLimits{MaxPerOrg: 5, MaxBytesPerOrg: 1000, MaxSnapshotBytes: 400, MaxInFlightPerSandbox: 1}
	// Three volumes into two free places: the whole request is refused.
	_, err := checkSnapshotOnDeleteAdmission(ctx, usageOf(3, 0, nil), "acme", 3, lim)
	if apierr.Reason(err) != apierr.FSSQuotaExceeded {
		t.Fatalf("3 volumes into 2 places: %v", err)
	}
	// The in-flight limit does not apply to the snapshots of an ending sandbox.
	if got, err := checkSnapshotOnDeleteAdmission(ctx, usageOf(2, 0, nil), "acme", 3, lim); err != nil || got != 400 {
		t.Fatalf("3 volumes into 3 places: %d, %v", got, err)
	}
}
