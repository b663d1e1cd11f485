package runnerapi

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/progress/progresspb"
	"github.com/sandboxd/sandboxd/internal/runner"
)

var _ runner.ProgressHandle = (*Client)(nil)

// progressWatcher is what WatchProgress needs of the runner (*runner.Runner).
type progressWatcher interface {
	WatchProgress(ctx context.Context, id string, send func(runner.StartProgress) error) error
}

// WatchProgress streams a sandbox's start progress (runner.Runner.WatchProgress).
func (s *Server) WatchProgress(ctx context.Context, req *connect.Request[runnerv1.WatchProgressRequest], stream *connect.ServerStream[runnerv1.WatchProgressResponse]) error {
	w, ok := s.r.(progressWatcher)
	if !ok {
		return apierr.New(apierr.NotImplemented, "runner "+s.runnerID+" reports no start progress", nil)
	}
	id := req.Msg.GetId()
	if err := w.WatchProgress(ctx, id, func(p runner.StartProgress) error {
		return stream.Send(ProgressToProto(p))
	}); err != nil {
		return toStatus(id, err)
	}
	return nil
}

// WatchProgress implements runner.ProgressHandle.
func (c *Client) WatchProgress(ctx context.Context, id string, send func(runner.StartProgress) error) error {
	stream, err := c.runner.WatchProgress(ctx, connect.NewRequest(&runnerv1.WatchProgressRequest{Id: id}))
	if err != nil {
		return fromStatus(ctx, c.id, err)
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		if err := send(ProgressFromProto(stream.Msg())); err != nil {
			return err
		}
	}
	if err := stream.Err(); err != nil {
		return fromStatus(ctx, c.id, err)
	}
	return nil
}

// ProgressToProto converts p (bounded by progress.Snapshot).
func ProgressToProto(p runner.StartProgress) *runnerv1.WatchProgressResponse {
	m := &runnerv1.WatchProgressResponse{State: runnerv1.State(p.State), Phase: progresspb.Phase(p.Phase), Pulls: progresspb.Pulls(p.Pulls)}
	if !p.Since.IsZero() {
		m.PhaseSince = timestamppb.New(p.Since)
	}
	return m
}

// ProgressFromProto converts m, bounded as a runner's own would be (progresspb.PullsFrom).
func ProgressFromProto(m *runnerv1.WatchProgressResponse) runner.StartProgress {
	p := runner.StartProgress{State: runner.State(m.GetState())}
	p.Phase = progresspb.PhaseFrom(m.GetPhase())
	if t := m.GetPhaseSince(); t != nil {
		p.Since = t.AsTime()
	}
	p.Pulls = progresspb.PullsFrom(m.GetPulls())
	return p
}
