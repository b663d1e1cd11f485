package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Per-organization quotas (issue 23 point 4): the sandboxes an organization runs at once,
// and the CPU and memory they hold, admitted at the gateway against the store so that
// gateway replicas sharing one database never admit past a limit.
//
// Each create reserves its share (store.Quotas.Reserve: one transaction that locks the
// organization, counts, and records the reservation) before its runner is asked; the
// sandbox's record takes the reservation's share in the transaction that records it
// (store.Sandbox.ReservationID), a failed create releases it, and a reservation whose
// gateway died mid create expires after QuotaOptions.ReservationTTL.
//
// What a sandbox holds is placement's need of the spec its runner's policy resolved
// (placement.Candidate.Need: per container its request, else its limit, else the
// runner's default), checked with the candidate placement ranks first. Every sandbox that
// has not ended counts: CREATING, RUNNING, TERMINATING, and PAUSED too, whether or not
// its runner released its resources, because a paused sandbox resumes on its runner
// (auto-resume on exec, files or endpoint traffic) without asking the gateway, which
// could then not refuse it. So ResumeSandbox takes no new share.
//
// Volume bytes (max_volume_bytes): a registered volume's row is its own reservation:
// store.Volumes.Create and Resize check the organization's volume bytes and write the
// row in one transaction under the same per-organization lock (volumes.go). Snapshot
// limits (max_snapshots, max_snapshot_bytes) override the gateway's --fss-max-* flags per
// organization (orgSnapshotLimits; enforced in fsslimits.go).

// DefaultQuotaReservationTTL is how long a create in flight holds its reservation at
// most: longer than any create or fork takes, short enough that a gateway that died mid
// create frees its organization's slots soon.
const DefaultQuotaReservationTTL = 10 * time.Minute

// maxQuotaRefresh bounds the live records one refused admission re-reads from their
// runners (quotaRefresh), and quotaRefreshTimeout the time it takes.
const (
	maxQuotaRefresh     = 1000
	quotaRefreshTimeout = 5 * time.Second
)

// QuotaOptions configures quotas.
type QuotaOptions struct {
	// Store keeps the quotas and reservations (needs a store-backed Index to count
	// sandboxes); nil: no quota is enforced and QuotaService answers
	// CWSANDBOX_NOT_IMPLEMENTED.
	Store store.Quotas
	// Defaults are the limits of organizations whose quota leaves them unset (nil or
	// store.Unlimited: unlimited).
	Defaults store.QuotaLimits
	// PlatformOrg is the organization whose SANDBOX_ADMIN keys set quotas (and read any
	// organization's); "" lets nobody set them.
	PlatformOrg string
	// ReservationTTL: DefaultQuotaReservationTTL when 0.
	ReservationTTL time.Duration
}

// Validate reports the first thing wrong with o (pure).
func (o QuotaOptions) Validate() error {
	for name, v := range map[string]*int64{"max sandboxes": o.Defaults.MaxSandboxes, "max cpu": o.Defaults.MaxMilliCPU, "max memory": o.Defaults.MaxMemoryBytes,
		"max volume bytes": o.Defaults.MaxVolumeBytes} {
		if v != nil && *v < store.Unlimited {
			return fmt.Errorf("default %s %d: -1 (unlimited) or more", name, *v)
		}
	}
	if o.ReservationTTL < 0 {
		return errors.New("quota reservation TTL is negative")
	}
	return nil
}

// LimitsFromFlags are the default limits of flags where 0 means unlimited
// (--default-max-sandboxes, --default-max-cpu-millicores, --default-max-memory-bytes).
func LimitsFromFlags(sandboxes, milliCPU, memoryBytes int64) store.QuotaLimits {
	f := func(v int64) *int64 {
		if v <= 0 {
			return nil
		}
		return &v
	}
	return store.QuotaLimits{MaxSandboxes: f(sandboxes), MaxMilliCPU: f(milliCPU), MaxMemoryBytes: f(memoryBytes)}
}

// quotaDefaults are the limits of an organization that sets none: the gateway's default
// quota, and its --fss-max-* snapshot limits.
func (s *Server) quotaDefaults() store.QuotaLimits {
	d := s.quota.Defaults
	fl := s.fss.Limits.WithDefaults()
	if d.MaxSnapshots == nil {
		n := int64(fl.MaxPerOrg)
		d.MaxSnapshots = &n
	}
	if d.MaxSnapshotBytes == nil {
		b := fl.MaxBytesPerOrg
		d.MaxSnapshotBytes = &b
	}
	return d
}

// volumeQuota is the default limits Volumes.Create and Resize check against (nil: no
// quota store, nothing checked).
func (s *Server) volumeQuota() *store.QuotaLimits {
	if s.quota.Store == nil {
		return nil
	}
	d := s.quotaDefaults()
	return &d
}

// orgSnapshotLimits are the snapshot limits of org: the gateway's (--fss-max-*) with
// the organization's max_snapshots and max_snapshot_bytes over them (-1: unlimited), and
// zero reports that a limit of 0 refuses every snapshot (which SnapshotLimits, where 0 is
// the default, cannot say).
func (s *Server) orgSnapshotLimits(ctx context.Context, org string) (l SnapshotLimits, zero string, err error) {
	l = s.fss.Limits.WithDefaults()
	if s.quota.Store == nil {
		return l, "", nil
	}
	set, err := s.quota.Store.Get(ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		return l, "", nil
	}
	if err != nil {
		return l, "", apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "reading the organization's quota: %v", err), 5*time.Second)
	}
	if v := set.MaxSnapshots; v != nil {
		switch {
		case *v < 0:
			l.MaxPerOrg = maxFSSMaxPerOrg * 1000
		case *v == 0:
			zero = "snapshots"
		default:
			l.MaxPerOrg = int(min(*v, maxFSSMaxPerOrg*1000))
		}
	}
	if v := set.MaxSnapshotBytes; v != nil {
		switch {
		case *v < 0:
			l.MaxBytesPerOrg = 1 << 62
		case *v == 0:
			zero = "bytes"
		default:
			l.MaxBytesPerOrg = *v
		}
	}
	return l, zero, nil
}

func newReservationID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "qr-" + hex.EncodeToString(b[:])
}

// reserveQuotaTotal reserves n sandboxes taking total in all of org's quota; it returns the
// reservation ("" when none is held: no quota, or no limit applies). A refusal first
// re-reads the organization's live sandboxes from their runners (the index may still
// count sandboxes that ended unobserved) and tries once more; then it is
// RESOURCE_EXHAUSTED CWSANDBOX_QUOTA_EXCEEDED naming the quota, its limit and the usage.
func (s *Server) reserveQuotaTotal(ctx context.Context, org string, n int64, total placement.Resources) (string, error) {
	q := s.quota.Store
	if q == nil {
		return "", nil
	}
	r := store.QuotaReservation{Org: org, Sandboxes: n, MilliCPU: total.MilliCPU, MemoryBytes: total.MemoryBytes}
	for attempt := 0; ; attempt++ {
		now := time.Now()
		r.ID, r.ExpiresAt = newReservationID(), now.Add(s.quota.ReservationTTL)
		id, _, err := q.Reserve(ctx, r, s.quota.Defaults, now)
		var qe *store.QuotaExceededError
		switch {
		case err == nil:
			return id, nil
		case !errors.As(err, &qe):
			return "", apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "checking the organization's quota: %v", err), 5*time.Second)
		case attempt == 0 && s.quotaRefresh(ctx, org) > 0:
			continue
		}
		return "", quotaExceeded(qe)
	}
}

// quotaExceeded is the API error of a refusal.
func quotaExceeded(qe *store.QuotaExceededError) error {
	what := map[string]string{store.QuotaSandboxes: "sandboxes", store.QuotaMilliCPU: "millicores of CPU", store.QuotaMemoryBytes: "bytes of memory",
		store.QuotaVolumeBytes: "bytes of registered volumes (max_volume_bytes)"}[qe.Quota]
	msg := fmt.Sprintf("the organization's quota of %d %s is used up: %d in use (with creates in flight), this request needs %d; delete sandboxes or ask an admin for more",
		qe.Limit, what, qe.Current, qe.Asked)
	if qe.Quota == store.QuotaVolumeBytes {
		msg = fmt.Sprintf("the organization's quota of %d %s is used up: its volumes take %d, this request needs %d more; delete volumes or ask an admin for more",
			qe.Limit, what, qe.Current, qe.Asked)
	}
	return apierr.New(apierr.QuotaExceeded, msg,
		map[string]string{"quota": qe.Quota, "limit": strconv.FormatInt(qe.Limit, 10), "current": strconv.FormatInt(qe.Current, 10),
			"requested": strconv.FormatInt(qe.Asked, 10)})
}

// releaseQuota drops what is left of reservation id (its sandboxes not recorded).
func (s *Server) releaseQuota(ctx context.Context, org, id string) {
	if id == "" || s.quota.Store == nil {
		return
	}
	if err := s.quota.Store.Release(context.WithoutCancel(ctx), org, id); err != nil {
		// It expires on its own (ReservationTTL).
		s.log.Warn("release quota reservation", "org", org, "reservation", id, "err", err)
	}
}

// quotaRefresh asks the runners about org's sandboxes the index holds as live (up to
// maxQuotaRefresh, within quotaRefreshTimeout) so that those that ended meanwhile are
// recorded ended, and returns how many it found ended.
func (s *Server) quotaRefresh(ctx context.Context, org string) int {
	if s.index.st == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, quotaRefreshTimeout)
	defer cancel()
	ended, seen, token := 0, 0, ""
	for seen < maxQuotaRefresh {
		page, next, err := s.index.st.List(ctx, org, store.SandboxFilter{}, store.Page{Size: store.MaxPageSize, Token: token})
		if err != nil {
			s.log.Warn("quota: list live sandboxes", "org", org, "err", err)
			return ended
		}
		for _, x := range page {
			if seen++; seen > maxQuotaRefresh || ctx.Err() != nil {
				return ended
			}
			rec, ok := s.index.adopt(x)
			if !ok {
				continue
			}
			r := s.runnerByID(s.index.runnerOf(rec))
			if r == nil {
				continue
			}
			if sb := s.current(ctx, rec, r); sb.State.Terminal() {
				ended++
			}
		}
		if next == "" {
			break
		}
		token = next
	}
	return ended
}

// needOf is what a record holds against its organization's quota.
func needOf(x store.Sandbox) placement.Resources {
	return placement.Resources{MilliCPU: x.MilliCPU, MemoryBytes: x.MemoryBytes}
}
