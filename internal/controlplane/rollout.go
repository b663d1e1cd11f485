package controlplane

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The automatic rollout itself runs in internal/rollout; this file shows its state (the
// runners' last update step, the channels' halts) and lets a platform admin resume a
// halted channel.

// ChannelTargets is the published release each release channel offers now: the automatic
// rollout's targets. Unlike what ApplyAvailableUpdate offers, it never falls back to the
// configured TargetVersions (the control plane's own version): upgrading the control plane
// must not by itself move every runner to a version nobody published — a single-host
// runner could not even verify it (a release record carries the checksums).
func (s *Service) ChannelTargets(ctx context.Context) (map[string]string, error) {
	rs, err := s.st.Releases().List(ctx)
	if err != nil {
		return nil, err
	}
	return store.CurrentVersions(rs), nil
}

// activeHalts are the stored halts of the channels' current targets (a halt of a version
// its channel no longer offers has ended, whether or not the controller dropped it yet).
func (s *Service) activeHalts(ctx context.Context, targets map[string]string) (map[string]store.RolloutHalt, error) {
	hs, err := s.st.Rollouts().Halts(ctx)
	if err != nil {
		return nil, storeErr(err)
	}
	out := map[string]store.RolloutHalt{}
	for _, h := range hs {
		if t := targets[h.Channel]; t != "" && t == h.Version {
			out[h.Channel] = h
		}
	}
	return out, nil
}

// withHalts sets rollout_halt_reason on runners whose channel's rollout is halted and
// answers the first of them.
func (s *Service) withHalts(ctx context.Context, targets map[string]string, runners ...*controlplanev1.ManagedRunner) (*connect.Response[controlplanev1.ManagedRunner], error) {
	halts, err := s.activeHalts(ctx, targets)
	if err != nil {
		return nil, err
	}
	for _, r := range runners {
		ch := store.ChannelStable
		if r.GetReleaseChannel() == controlplanev1.ReleaseChannel_RAPID {
			ch = store.ChannelRapid
		}
		if h, ok := halts[ch]; ok && r.GetStatus() != nil {
			r.Status.RolloutHaltReason = fmt.Sprintf("rollout of %s on %s halted: %s", h.Version, ch, h.Reason)
		}
	}
	if len(runners) == 0 {
		return nil, nil
	}
	return connect.NewResponse(runners[0]), nil
}

// channelRollouts is each channel's rollout state, STABLE first.
func (s *Service) channelRollouts(ctx context.Context, targets map[string]string) ([]*controlplanev1.ChannelRollout, error) {
	halts, err := s.activeHalts(ctx, targets)
	if err != nil {
		return nil, err
	}
	var out []*controlplanev1.ChannelRollout
	for _, ch := range []string{store.ChannelStable, store.ChannelRapid} {
		out = append(out, channelRollout(ch, targets[ch], halts))
	}
	return out, nil
}

func channelRollout(ch, target string, halts map[string]store.RolloutHalt) *controlplanev1.ChannelRollout {
	c := &controlplanev1.ChannelRollout{Channel: channelProto(ch), TargetVersion: target, State: controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE}
	if h, ok := halts[ch]; ok {
		c.State = controlplanev1.RolloutState_ROLLOUT_STATE_HALTED
		c.HaltReason, c.HaltTime, c.HaltedByRunner = h.Reason, timestamppb.New(h.HaltedAt), h.Org+"/"+h.RunnerID
	}
	return c
}

func channelProto(ch string) controlplanev1.ReleaseChannel {
	if ch == store.ChannelRapid {
		return controlplanev1.ReleaseChannel_RAPID
	}
	return controlplanev1.ReleaseChannel_STABLE
}

// ResumeRollout lifts a channel's halt. Platform admins only: like a publish, it decides
// what every organization's runners are moved to.
func (s *Service) ResumeRollout(ctx context.Context, req *connect.Request[controlplanev1.ResumeRolloutRequest]) (*connect.Response[controlplanev1.ChannelRollout], error) {
	if err := s.requirePlatformAdmin(ctx, "ResumeRollout"); err != nil {
		return nil, err
	}
	var vs violations
	var ch string
	switch req.Msg.GetChannel() {
	case controlplanev1.ReleaseChannel_STABLE:
		ch = store.ChannelStable
	case controlplanev1.ReleaseChannel_RAPID:
		ch = store.ChannelRapid
	default:
		vs.add("channel", "must be STABLE or RAPID (got %d)", int32(req.Msg.GetChannel()))
	}
	if err := vs.err("invalid channel"); err != nil {
		return nil, err
	}
	resumed, err := s.st.Rollouts().Resume(ctx, ch)
	if err != nil {
		return nil, storeErr(err)
	}
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	p := principal(ctx)
	s.log.Info("rollout resumed", "channel", ch, "was_halted", resumed, "org", p.Org, "key", p.KeyID)
	return connect.NewResponse(channelRollout(ch, targets[ch], nil)), nil
}

// updateResultProto is a runner's last update step as the API shows it (nil: none).
func updateResultProto(a *store.UpdateAttempt) *controlplanev1.UpdateResult {
	if a == nil {
		return nil
	}
	out := &controlplanev1.UpdateResult{FromVersion: a.From, ToVersion: a.To, Reason: a.Reason,
		StartTime: timestamppb.New(a.StartedAt), Deadline: timestamppb.New(a.Deadline)}
	switch a.State {
	case store.UpdateInProgress:
		out.State = controlplanev1.UpdateState_UPDATE_STATE_IN_PROGRESS
	case store.UpdateSucceeded:
		out.State = controlplanev1.UpdateState_UPDATE_STATE_SUCCEEDED
	case store.UpdateRolledBack:
		out.State = controlplanev1.UpdateState_UPDATE_STATE_ROLLED_BACK
	}
	if a.EndedAt != nil {
		out.EndTime = timestamppb.New(*a.EndedAt)
	}
	return out
}
