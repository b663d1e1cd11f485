package gateway

import (
	"context"
	"slices"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// archAliases maps the names clients use to GOARCH.
var archAliases = map[string]string{"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

func (s *Server) ListAvailableRunners(ctx context.Context, req *connect.Request[sandboxv1.ListAvailableRunnersRequest]) (*connect.Response[sandboxv1.ListAvailableRunnersResponse], error) {
	m := req.Msg
	out := &sandboxv1.ListAvailableRunnersResponse{}
	for _, r := range s.runners {
		ar, err := s.availableRunner(ctx, r, m.GetView())
		if err != nil {
			return nil, err
		}
		switch {
		case m.GetRunnerGroupId() != "" && m.GetRunnerGroupId() != r.Group():
			continue
		case m.GetGpuType() != "" && !slices.Contains(ar.GetCapabilities().GetSupportedGpuTypes(), m.GetGpuType()):
			continue
		case m.GetArchitecture() != "" && !slices.Contains(ar.GetCapabilities().GetSupportedArchitectures(), archAliases[m.GetArchitecture()]):
			continue
		case m.GetHealthyOnly() && !ar.GetHealthy():
			continue
		case m.GetServiceVisibility() != sandboxv1.Visibility_VISIBILITY_UNSPECIFIED &&
			!slices.Contains(ar.GetCapabilities().GetSupportedServiceVisibilities(), m.GetServiceVisibility()):
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
	r := s.runnerByID(m.GetRunnerId())
	if r == nil || m.GetOrganizationId() != principal(ctx).Org {
		return nil, apierr.New(connect.CodeNotFound, apierr.RunnerNotFound, "runner "+m.GetRunnerId()+" not found", map[string]string{"runner_id": m.GetRunnerId()})
	}
	view := m.GetView()
	if view == sandboxv1.RunnerView_RUNNER_VIEW_UNSPECIFIED {
		view = sandboxv1.RunnerView_RUNNER_VIEW_FULL
	}
	ar, err := s.availableRunner(ctx, r, view)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(ar), nil
}

// availableRunner describes r; live free resources only in the FULL view.
func (s *Server) availableRunner(ctx context.Context, r Runner, view sandboxv1.RunnerView) (*sandboxv1.AvailableRunner, error) {
	c, err := r.Capacity(ctx)
	ar := &sandboxv1.AvailableRunner{
		RunnerId:       r.ID(),
		RunnerGroupId:  r.Group(),
		Healthy:        err == nil,
		ConnectedAt:    ts(c.ConnectedAt),
		OrganizationId: principal(ctx).Org,
		Capabilities: &sandboxv1.RunnerCapabilitySummary{
			MaxCpuMillicores:             c.MilliCPU,
			MaxMemoryBytes:               c.MemoryBytes,
			SupportedArchitectures:       c.Architectures,
			SupportedServiceVisibilities: []sandboxv1.Visibility{sandboxv1.Visibility_VISIBILITY_UNSPECIFIED},
		},
	}
	if view == sandboxv1.RunnerView_RUNNER_VIEW_FULL {
		ar.Resources = &sandboxv1.RunnerResourceSummary{
			AvailableCpuMillicores: max(c.MilliCPU-c.UsedMilliCPU, 0),
			AvailableMemoryBytes:   max(c.MemoryBytes-c.UsedMemoryBytes, 0),
			RunningSandboxes:       int32(c.Running),
		}
	}
	return ar, nil
}
