package sandbox

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
)

// StartPhase is the step a sandbox's start is in (sandboxd.sandbox.v1.StartPhase).
type StartPhase int32

// Start phases, numbered as in sandboxd.sandbox.v1.StartPhase.
const (
	PhaseUnspecified       StartPhase = 0
	PhaseRestoringVolumes  StartPhase = 1
	PhasePullingImage      StartPhase = 2
	PhaseStartingContainer StartPhase = 3
	PhaseStartingCommand   StartPhase = 4
	PhaseRunning           StartPhase = 5 // the last update: the sandbox runs
	PhaseEnded             StartPhase = 6 // the last update: it ended before it ran
	PhaseWaitingForRunner  StartPhase = 7
)

// Progress is one update of a sandbox's start.
type Progress struct {
	State State
	Phase StartPhase
	// WaitingFor is what the phase waits for, in words ("pulling image", "starting
	// container", …); empty once started.
	WaitingFor string
	PhaseSince time.Time // zero: unknown
	// Pulls are its image pulls under way or done (an image already cached is none).
	Pulls []ImagePull
}

// ImagePull is one image pull's progress, in compressed bytes.
type ImagePull struct {
	Image                   string
	LayersDone, LayersTotal int
	BytesDone, BytesTotal   int64
	// Elapsed is how long the pull has taken: until now, or until its last layer was
	// complete (0: the server does not say).
	Elapsed time.Duration
	// Layers lists at most 16 layers, those not complete first.
	Layers []LayerProgress
}

// LayerProgress is one layer's progress; Digest is its first 12 hex digits.
type LayerProgress struct {
	Digest                string
	BytesDone, BytesTotal int64
	Complete              bool
}

// WatchProgress calls fn with the start progress of sandbox id (sandboxd's
// WatchSandboxProgress, beside the wire protocol): at once, then at each change (at
// most four a second), until the sandbox runs or has ended (the last update says
// which) or the server ends the watch after 15 minutes; it returns nil then. An error
// of fn ends the watch with it. Progress is for showing: a server without the extension
// answers an error (UNIMPLEMENTED), and callers that only show progress wait as before.
func (c *Client) WatchProgress(ctx context.Context, id string, fn func(Progress) error) error {
	stream, err := c.state.WatchSandboxProgress(ctx, connect.NewRequest(&statev1.WatchSandboxProgressRequest{SandboxId: id}))
	if err != nil {
		return fromRPC(err)
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
		if err := fn(progressFromProto(stream.Msg())); err != nil {
			return err
		}
	}
	if err := stream.Err(); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return ctx.Err()
		}
		return fromRPC(err)
	}
	return nil
}

func progressFromProto(m *statev1.WatchSandboxProgressResponse) Progress {
	p := Progress{Phase: StartPhase(m.GetPhase()), WaitingFor: m.GetWaitingFor()}
	p.State, _ = ParseState(m.GetState())
	if t := m.GetPhaseSince(); t != nil {
		p.PhaseSince = t.AsTime()
	}
	for _, ip := range m.GetPulls() {
		pl := ImagePull{Image: ip.GetImage(), LayersDone: int(ip.GetLayersDone()), LayersTotal: int(ip.GetLayersTotal()),
			BytesDone: ip.GetBytesDone(), BytesTotal: ip.GetBytesTotal()}
		if d := ip.GetElapsed(); d.CheckValid() == nil && d.AsDuration() > 0 {
			pl.Elapsed = d.AsDuration()
		}
		for _, l := range ip.GetLayers() {
			pl.Layers = append(pl.Layers, LayerProgress{Digest: l.GetDigest(), BytesDone: l.GetBytesDone(), BytesTotal: l.GetBytesTotal(), Complete: l.GetComplete()})
		}
		p.Pulls = append(p.Pulls, pl)
	}
	return p
}

// WatchProgress is Client.WatchProgress for this sandbox.
func (s *Sandbox) WatchProgress(ctx context.Context, fn func(Progress) error) error {
	return s.c.WatchProgress(ctx, s.id, fn)
}
