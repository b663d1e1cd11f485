package gateway

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/progress/progresspb"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// WatchSandboxProgress implements sandboxd.sandbox.v1.SandboxStateService: it relays the
// start progress of the caller's sandbox from its runner (runner.ProgressHandle), which
// bounds it (at most four messages a second, progress.MaxPulls pulls of
// progress.MaxLayers layers). Another organization's sandbox is NOT_FOUND, as
// everywhere; a runner that reports no progress, or no longer knows the sandbox, gives
// one message from the sandbox's state. So does a watch beyond MaxProgressWatches on
// this gateway or MaxProgressWatchesPerOrg of the caller's organization: each open watch
// holds a stream to the runner, and a caller controls how many it opens.
func (s *Server) WatchSandboxProgress(ctx context.Context, req *connect.Request[statev1.WatchSandboxProgressRequest], stream *connect.ServerStream[statev1.WatchSandboxProgressResponse]) error {
	rec, r, err := s.lookup(ctx, req.Msg.GetSandboxId())
	if err != nil {
		return err
	}
	sent := false
	org := principal(ctx).Org
	if ph, ok := r.(runner.ProgressHandle); ok && s.progressWatch.acquire(org) {
		defer s.progressWatch.release(org)
		err := ph.WatchProgress(ctx, rec.id, func(p runner.StartProgress) error {
			sent = true
			return stream.Send(progressToWire(rec.id, p))
		})
		switch {
		case err == nil:
			return nil
		case sent || !errors.Is(err, runtime.ErrNotFound):
			return runner.APIError(rec.id, err, "")
		}
	}
	sb := s.current(ctx, rec, r)
	return stream.Send(progressToWire(rec.id, runner.StartProgress{State: sb.State, Snapshot: progress.Snapshot{Phase: phaseOf(sb.State)}}))
}

// The bounds of the WatchSandboxProgress streams open at once, on a gateway and per
// organization; a watch beyond them gets one message from the sandbox's state.
const (
	MaxProgressWatches       = 1024
	MaxProgressWatchesPerOrg = 64
)

// phaseOf is the phase a sandbox in state st is in, as far as its state tells.
func phaseOf(st runner.State) progress.Phase {
	switch st {
	case runner.StatePending:
		return progress.PhaseWaitingForRunner
	case runner.StateCreating:
		return progress.PhaseStartingContainer
	case runner.StateRunning, runner.StatePaused:
		return progress.PhaseRunning
	}
	return progress.PhaseEnded
}

func progressToWire(id string, p runner.StartProgress) *statev1.WatchSandboxProgressResponse {
	m := &statev1.WatchSandboxProgressResponse{SandboxId: id, State: sandboxv1.State(p.State).String(),
		Phase: progresspb.Phase(p.Phase), WaitingFor: p.Phase.Waiting(), Pulls: progresspb.Pulls(p.Pulls)}
	if !p.Since.IsZero() {
		m.PhaseSince = timestamppb.New(p.Since)
	}
	return m
}
