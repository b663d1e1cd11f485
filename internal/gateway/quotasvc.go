package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

// QuotaService (sandboxd.quota.v1): the organizations' quotas, set by the platform
// organization's admins, read by every organization for itself (quota.go enforces them).

// maxOrgIDLen bounds an org_id a caller names.
const maxOrgIDLen = 128

func (s *Server) quotaStore() (store.Quotas, error) {
	if s.quota.Store == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "this gateway enforces no quotas (it has no store)")
	}
	return s.quota.Store, nil
}

// platformAdmin reports whether the caller is an admin of the platform organization.
func (s *Server) platformAdmin(ctx context.Context) bool {
	p := principal(ctx)
	return s.quota.PlatformOrg != "" && p.Org == s.quota.PlatformOrg && p.Role == auth.RoleAdmin
}

// quotaOrg is the organization a quota call is about (field org_id; "" the caller's
// when allowEmpty), checked: a caller reads its own organization, the platform's admins
// any.
func (s *Server) quotaOrg(ctx context.Context, org string, allowEmpty bool) (string, error) {
	if org == "" && allowEmpty {
		return principal(ctx).Org, nil
	}
	if vs := orgIDViolations(org); vs != nil {
		return "", apierr.Invalid(apierr.InvalidRequest, "invalid org_id: "+apierr.Describe(vs), vs)
	}
	if org != principal(ctx).Org && !s.platformAdmin(ctx) {
		return "", apierr.New(apierr.PermissionDenied, "only an admin key of the platform organization reads another organization's quota", nil)
	}
	return org, nil
}

func orgIDViolations(org string) []apierr.Violation {
	switch {
	case org == "":
		return []apierr.Violation{{Field: "org_id", Description: "is required"}}
	case len(org) > maxOrgIDLen:
		return []apierr.Violation{{Field: "org_id", Description: fmt.Sprintf("is %d bytes, at most %d", len(org), maxOrgIDLen)}}
	case slices.ContainsFunc([]rune(org), func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }):
		return []apierr.Violation{{Field: "org_id", Description: "holds a space or a character that does not print"}}
	}
	return nil
}

func (s *Server) GetQuota(ctx context.Context, req *connect.Request[quotav1.GetQuotaRequest]) (*connect.Response[quotav1.Quota], error) {
	q, err := s.quotaStore()
	if err != nil {
		return nil, err
	}
	org, err := s.quotaOrg(ctx, req.Msg.GetOrgId(), false)
	if err != nil {
		return nil, err
	}
	set, err := q.Get(ctx, org)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "read quota: %v", err), 5*time.Second)
	}
	set.Org = org
	return connect.NewResponse(s.quotaProto(set)), nil
}

func (s *Server) SetQuota(ctx context.Context, req *connect.Request[quotav1.SetQuotaRequest]) (*connect.Response[quotav1.Quota], error) {
	q, err := s.quotaStore()
	if err != nil {
		return nil, err
	}
	p := principal(ctx)
	if !s.platformAdmin(ctx) {
		s.log.Warn("quota change refused: not an admin of the platform organization", "org", p.Org, "key", p.KeyID, "target", req.Msg.GetOrgId())
		return nil, apierr.New(apierr.PermissionDenied,
			"quotas are the platform operator's: only an admin key of the platform organization sets them (an organization never sets its own)", nil)
	}
	m := req.Msg
	vs := orgIDViolations(m.GetOrgId())
	l := m.GetLimits()
	for _, f := range []struct {
		name string
		v    *int64
	}{{"limits.max_sandboxes", l.MaxSandboxes}, {"limits.max_cpu_millicores", l.MaxCpuMillicores}, {"limits.max_memory_bytes", l.MaxMemoryBytes},
		{"limits.max_volume_bytes", l.MaxVolumeBytes}, {"limits.max_snapshots", l.MaxSnapshots}, {"limits.max_snapshot_bytes", l.MaxSnapshotBytes}} {
		if f.v != nil && *f.v < store.Unlimited {
			vs = append(vs, apierr.Violation{Field: f.name, Description: fmt.Sprintf("must be -1 (unlimited) or more, got %d", *f.v)})
		}
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid quota: "+apierr.Describe(vs), vs)
	}
	if s.orgs != nil {
		orgs, err := s.orgs.List(ctx)
		if err != nil {
			return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "list organizations: %v", err), 5*time.Second)
		}
		if !slices.ContainsFunc(orgs, func(o store.Org) bool { return o.ID == m.GetOrgId() }) {
			vs := []apierr.Violation{{Field: "org_id", Description: fmt.Sprintf("no organization %q", m.GetOrgId())}}
			return nil, apierr.Invalid(apierr.InvalidRequest, "invalid quota: "+apierr.Describe(vs), vs)
		}
	}
	out, err := q.Put(ctx, store.Quota{Org: m.GetOrgId(), UpdatedBy: p.KeyID,
		QuotaLimits: store.QuotaLimits{MaxSandboxes: l.MaxSandboxes, MaxMilliCPU: l.MaxCpuMillicores, MaxMemoryBytes: l.MaxMemoryBytes,
			MaxVolumeBytes: l.MaxVolumeBytes, MaxSnapshots: l.MaxSnapshots, MaxSnapshotBytes: l.MaxSnapshotBytes}})
	if err != nil {
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "set quota: %v", err), 5*time.Second)
	}
	s.log.Info("quota set", "org", out.Org, "by", p.KeyID, "max_sandboxes", fmtLimit(out.MaxSandboxes),
		"max_cpu_millicores", fmtLimit(out.MaxMilliCPU), "max_memory_bytes", fmtLimit(out.MaxMemoryBytes),
		"max_volume_bytes", fmtLimit(out.MaxVolumeBytes), "max_snapshots", fmtLimit(out.MaxSnapshots), "max_snapshot_bytes", fmtLimit(out.MaxSnapshotBytes))
	return connect.NewResponse(s.quotaProto(out)), nil
}

func (s *Server) GetQuotaUsage(ctx context.Context, req *connect.Request[quotav1.GetQuotaUsageRequest]) (*connect.Response[quotav1.QuotaUsage], error) {
	q, err := s.quotaStore()
	if err != nil {
		return nil, err
	}
	org, err := s.quotaOrg(ctx, req.Msg.GetOrgId(), true)
	if err != nil {
		return nil, err
	}
	set, err := q.Get(ctx, org)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "read quota: %v", err), 5*time.Second)
	}
	s.quotaRefresh(ctx, org) // sandboxes that ended unobserved count no more
	u, err := q.Usage(ctx, org, time.Now())
	if err != nil {
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "read quota usage: %v", err), 5*time.Second)
	}
	eff := set.QuotaLimits.Over(s.quotaDefaults())
	out := &quotav1.QuotaUsage{OrgId: org, Effective: limitsProto(eff, true),
		Sandboxes: u.Sandboxes, CpuMillicores: u.MilliCPU, MemoryBytes: u.MemoryBytes,
		ReservedSandboxes: u.ReservedSandboxes, ReservedCpuMillicores: u.ReservedMilliCPU, ReservedMemoryBytes: u.ReservedMemoryBytes,
		Volumes: u.Volumes, VolumeBytes: u.VolumeBytes}
	if s.snaps != nil {
		// The file-system snapshot quota (fsslimits.go): the organization's, else the
		// gateway's --fss-max-* (-1: unlimited).
		n, b, err := s.snaps.SnapshotUsage(ctx, org)
		if err == nil {
			out.Snapshots, out.SnapshotBytes = int64(n), b
		}
		out.MaxSnapshots, out.MaxSnapshotBytes = *eff.MaxSnapshots, *eff.MaxSnapshotBytes
	}
	return connect.NewResponse(out), nil
}

func (s *Server) quotaProto(q store.Quota) *quotav1.Quota {
	out := &quotav1.Quota{OrgId: q.Org, Limits: limitsProto(q.QuotaLimits, false), Effective: limitsProto(q.QuotaLimits.Over(s.quotaDefaults()), true),
		UpdatedBy: q.UpdatedBy}
	if !q.UpdatedAt.IsZero() {
		out.UpdateTime = timestamppb.New(q.UpdatedAt)
	}
	return out
}

// limitsProto renders l; effective limits show an unlimited one as absent.
func limitsProto(l store.QuotaLimits, effective bool) *quotav1.QuotaLimits {
	f := func(v *int64) *int64 {
		if v == nil || (effective && *v < 0) {
			return nil
		}
		x := *v
		return &x
	}
	return &quotav1.QuotaLimits{MaxSandboxes: f(l.MaxSandboxes), MaxCpuMillicores: f(l.MaxMilliCPU), MaxMemoryBytes: f(l.MaxMemoryBytes),
		MaxVolumeBytes: f(l.MaxVolumeBytes), MaxSnapshots: f(l.MaxSnapshots), MaxSnapshotBytes: f(l.MaxSnapshotBytes)}
}

func fmtLimit(v *int64) string {
	switch {
	case v == nil:
		return "default"
	case *v < 0:
		return "unlimited"
	}
	return fmt.Sprint(*v)
}
