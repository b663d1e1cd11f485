package runnerapi

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// MaxWarmTargets bounds the targets of one SetWarmPools call.
const MaxWarmTargets = 1024

var _ runner.WarmHandle = (*Client)(nil)

// SetWarmPools implements runner.WarmHandle.
func (c *Client) SetWarmPools(ctx context.Context, targets []runtime.WarmTarget) error {
	req := &runnerv1.SetWarmPoolsRequest{Targets: make([]*runnerv1.WarmTarget, len(targets))}
	for i, t := range targets {
		req.Targets[i] = &runnerv1.WarmTarget{Key: t.Key, Spec: specToProto(t.Spec), Size: int32(min(max(t.Size, 0), runtime.MaxWarmSize))} //nolint:gosec // bounded
	}
	_, err := c.runner.SetWarmPools(ctx, connect.NewRequest(req))
	return fromStatus(ctx, c.id, err)
}

func (a admitting) SetWarmPools(ctx context.Context, targets []runtime.WarmTarget) error {
	return a.l.SetWarmPools(ctx, targets)
}

// SetWarmPools passes the targets its own policy accepts (as Create's admit) to the
// runner; a target it rejects is left out (logged), not an error of the call.
func (s *Server) SetWarmPools(ctx context.Context, req *connect.Request[runnerv1.SetWarmPoolsRequest]) (*connect.Response[runnerv1.SetWarmPoolsResponse], error) {
	wh, ok := s.r.(runner.WarmHandle)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this runner keeps no warm pools"))
	}
	in := req.Msg.GetTargets()
	if len(in) > MaxWarmTargets {
		return nil, apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("%d warm targets, at most %d", len(in), MaxWarmTargets),
			[]apierr.Violation{{Field: "targets", Description: fmt.Sprintf("at most %d", MaxWarmTargets)}})
	}
	var out []runtime.WarmTarget
	for i, t := range in {
		if t.GetSize() < 0 || t.GetSize() > runtime.MaxWarmSize {
			return nil, apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("warm target %d: size %d not in [0, %d]", i, t.GetSize(), runtime.MaxWarmSize),
				[]apierr.Violation{{Field: fmt.Sprintf("targets[%d].size", i), Description: fmt.Sprintf("must be in [0, %d]", runtime.MaxWarmSize)}})
		}
		cr := runner.CreateRequest{Spec: specFromProto(t.GetSpec())}
		if err := s.admit(ctx, &cr); err != nil {
			s.log.Info("warm target refused by the runner's policy", "target", t.GetKey(), "err", err)
			continue
		}
		out = append(out, runtime.WarmTarget{Key: t.GetKey(), Spec: cr.Spec, Size: int(t.GetSize())})
	}
	if err := wh.SetWarmPools(ctx, out); err != nil {
		return nil, toStatus("", err)
	}
	return connect.NewResponse(&runnerv1.SetWarmPoolsResponse{Accepted: int32(len(out))}), nil //nolint:gosec // at most MaxWarmTargets
}
