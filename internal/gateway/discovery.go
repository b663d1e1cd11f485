package gateway

import (
	"context"
	"slices"
	"sync"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// archAliases maps the names clients use to GOARCH.
var archAliases = map[string]string{"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

func (s *Server) ListAvailableRunners(ctx context.Context, req *connect.Request[sandboxv1.ListAvailableRunnersRequest]) (*connect.Response[sandboxv1.ListAvailableRunnersResponse], error) {
	m := req.Msg
	if a := m.GetArchitecture(); a != "" && archAliases[a] == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "unknown architecture "+a, []apierr.Violation{{Field: "architecture", Description: "must be one of amd64, x86_64, arm64, aarch64"}})
	}
	if m.GetPageToken() != "" {
		// Every runner fits one page: this server never issues a token.
		return nil, badPageToken()
	}
	out := &sandboxv1.ListAvailableRunnersResponse{}
	s.views.ensureLoaded(ctx) // owners are known once probed
	recs := s.orgRecords(ctx) // one index read for every runner's count
	for i, r := range s.runners {
		if !s.serves(r, principal(ctx).Org) {
			continue // another organization's runner is not listed
		}
		ar := s.availableRunner(ctx, i, m.GetView(), recs)
		caps := ar.GetCapabilities()
		switch {
		case m.GetRunnerGroupId() != "" && m.GetRunnerGroupId() != r.Group():
			continue
		case m.GetGpuType() != "" && !slices.Contains(caps.GetSupportedGpuTypes(), m.GetGpuType()):
			continue
		case m.GetArchitecture() != "" && !slices.Contains(caps.GetSupportedArchitectures(), archAliases[m.GetArchitecture()]):
			continue
		case m.GetHealthyOnly() && !ar.GetHealthy():
			continue
		case m.GetServiceVisibility() != sandboxv1.Visibility_VISIBILITY_UNSPECIFIED &&
			!slices.Contains(caps.GetSupportedServiceVisibilities(), m.GetServiceVisibility()):
			continue
		}
		out.Runners = append(out.Runners, ar)
	}
	return connect.NewResponse(out), nil
}

func (s *Server) GetAvailableRunner(ctx context.Context, req *connect.Request[sandboxv1.GetAvailableRunnerRequest]) (*connect.Response[sandboxv1.AvailableRunner], error) {
	m := req.Msg
	if m.GetOrganizationId() == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "organization_id is required", []apierr.Violation{{Field: "organization_id", Description: "is required"}})
	}
	s.views.ensureLoaded(ctx) // owners are known once probed
	i := slices.IndexFunc(s.runners, func(r runner.Handle) bool { return r.ID() == m.GetRunnerId() })
	if i < 0 || m.GetOrganizationId() != principal(ctx).Org || !s.serves(s.runners[i], principal(ctx).Org) {
		return nil, apierr.New(apierr.RunnerNotFound, "runner "+m.GetRunnerId()+" not found", map[string]string{"runner_id": m.GetRunnerId()})
	}
	view := m.GetView()
	if view == sandboxv1.RunnerView_RUNNER_VIEW_UNSPECIFIED {
		view = sandboxv1.RunnerView_RUNNER_VIEW_FULL
	}
	return connect.NewResponse(s.availableRunner(ctx, i, view, s.orgRecords(ctx))), nil
}

// orgRecords reads the caller's organization's index records once, when first needed.
func (s *Server) orgRecords(ctx context.Context) func() []*record {
	return sync.OnceValue(func() []*record { return s.index.list(ctx, principal(ctx).Org, false) })
}

// availableRunner describes runner i: what its policy and host allow, and in the FULL
// view what is free right now (asked of the runner; the gateway's last view of it when
// it does not answer), counting the caller's sandboxes among recs.
func (s *Server) availableRunner(ctx context.Context, i int, view sandboxv1.RunnerView, recs func() []*record) *sandboxv1.AvailableRunner {
	r := s.runners[i]
	w := s.views.runner(ctx, i)
	if view == sandboxv1.RunnerView_RUNNER_VIEW_FULL {
		// Live figures: ask the runner itself, and fall back to the last view.
		lctx, cancel := context.WithTimeout(ctx, viewTimeout)
		if c, err := r.Capacity(lctx); err == nil {
			w.capacity, w.recent, w.connected = c, nil, true
		}
		cancel()
	}
	c := w.capacity
	caps := &sandboxv1.RunnerCapabilitySummary{
		MaxCpuMillicores:       c.MilliCPU,
		MaxMemoryBytes:         c.MemoryBytes,
		MaxGpuCount:            c.GPUs,
		SupportedArchitectures: c.Architectures,
		// Private and custom ports are the backend's to open; public ones need the edge.
		SupportedServiceVisibilities: []sandboxv1.Visibility{sandboxv1.Visibility_VISIBILITY_UNSPECIFIED,
			sandboxv1.Visibility_VISIBILITY_PRIVATE, sandboxv1.Visibility_VISIBILITY_CUSTOM},
	}
	if c.EdgeDomain != "" {
		caps.SupportedServiceVisibilities = append(caps.SupportedServiceVisibilities, sandboxv1.Visibility_VISIBILITY_PUBLIC)
	}
	if p := w.policy; p != nil {
		if rc := p.Constraints.Resources; rc != nil {
			if q := rc.MaxCPU; q != "" {
				if v, err := quantity.ParseCPU(string(q)); err == nil && (caps.MaxCpuMillicores == 0 || v < caps.MaxCpuMillicores) {
					caps.MaxCpuMillicores = v
				}
			}
			if q := rc.MaxMemory; q != "" {
				if v, err := quantity.ParseMemory(string(q)); err == nil && (caps.MaxMemoryBytes == 0 || v < caps.MaxMemoryBytes) {
					caps.MaxMemoryBytes = v
				}
			}
			if g := rc.MaxGPU; g != nil && *g < caps.MaxGpuCount {
				caps.MaxGpuCount = *g
			}
		}
		// Registered volumes' storage classes: what the runner's policy allows, else its
		// default class (the cluster's own classes are not asked for).
		if class, allowed := p.VolumeStorageClasses(); allowed != nil {
			caps.AvailableStorageClasses = allowed
		} else if class != "" {
			caps.AvailableStorageClasses = []string{class}
		}
		if sc := p.Constraints.Security; sc != nil && sc.PrivilegedAllowed != nil {
			// The platform's word is final: a policy cannot allow what no runner runs.
			caps.SupportsPrivileged = *sc.PrivilegedAllowed && policy.RunnerPlatform(nil).PrivilegedAllowed
		}
	}
	hv := s.health.View(r.ID(), principal(ctx).Org)
	ar := &sandboxv1.AvailableRunner{
		RunnerId:       r.ID(),
		RunnerGroupId:  r.Group(),
		Healthy:        w.connected && hv.State != health.Quarantined,
		ConnectedAt:    ts(c.ConnectedAt),
		OrganizationId: principal(ctx).Org,
		Capabilities:   caps,
		Tags:           healthTags(hv),
	}
	if view == sandboxv1.RunnerView_RUNNER_VIEW_FULL && w.connected {
		// What the runner still admits: its capacity (CPU overcommitted) less the requests
		// of its sandboxes and of the creates in flight.
		used, n := w.usage()
		reserved, _ := s.reserved.Held(r.ID())
		free := c.Room(used, n).Free(reserved)
		ar.Resources = &sandboxv1.RunnerResourceSummary{
			AvailableCpuMillicores: free.MilliCPU,
			AvailableMemoryBytes:   free.MemoryBytes,
			AvailableGpuCount:      free.GPUs,
			// The caller's own sandboxes only: another organization's count is not its business.
			RunningSandboxes: int32(s.liveSandboxes(ctx, recs(), r)),
		}
	}
	return ar
}

// liveSandboxes counts the sandboxes of recs (one organization's) on runner r that are
// neither ended nor being deleted (a delete frees its place at once). Those the index
// last saw alive are asked of the runner: another replica may have deleted them.
func (s *Server) liveSandboxes(ctx context.Context, recs []*record, r runner.Handle) int {
	n := 0
	for _, rec := range recs {
		if s.index.runnerOf(rec) != r.ID() {
			continue
		}
		if st := s.index.lastOf(rec).State; st.Terminal() || st == runner.StateTerminating {
			continue
		}
		if st := s.current(ctx, rec, r).State; !st.Terminal() && st != runner.StateTerminating {
			n++
		}
	}
	return n
}

// Discovery tags of runner health (a sandboxd extension of AvailableRunner.tags; the
// official client reads tags as opaque strings): a runner that is not healthy for the
// caller carries TagHealth+state and TagHealthReason+why. A quarantined runner is also
// healthy=false.
const (
	TagHealth       = "sandboxd.health="
	TagHealthReason = "sandboxd.health.reason="
)

// healthTags are the discovery tags of health view v (none when healthy).
func healthTags(v health.View) []string {
	if v.State == health.Healthy {
		return nil
	}
	return []string{TagHealth + v.State.String(), TagHealthReason + v.Reason}
}
