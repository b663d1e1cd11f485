package controlplane

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The automatic rollout itself runs in internal/rollout; this file shows its state (the
// runners' last update step, the channels' halts, each organization seeing its own) and
// lets a platform admin resume a halted channel for one organization or all.

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

// activeHalts are org's stored halts of the channels' current targets, by channel (a halt
// of a version its channel no longer offers has ended, whether or not the controller
// dropped it yet). Only org's: a halt's reason and runner are its organization's, and no
// other tenant may read them.
func (s *Service) activeHalts(ctx context.Context, targets map[string]string, org string) (map[string]store.RolloutHalt, error) {
	if org == "" {
		return map[string]store.RolloutHalt{}, nil // "" would mean every organization's
	}
	hs, err := s.st.Rollouts().Halts(ctx, org)
	if err != nil {
		return nil, storeErr(err)
	}
	out := map[string]store.RolloutHalt{}
	for _, h := range hs {
		if t := targets[h.Channel]; t != "" && t == h.Version && h.Org == org {
			out[h.Channel] = h
		}
	}
	return out, nil
}

// withHalts sets rollout_halt_reason on org's runners whose channel's rollout is halted
// for org, and answers the first of them.
func (s *Service) withHalts(ctx context.Context, targets map[string]string, org string, runners ...*controlplanev1.ManagedRunner) (*connect.Response[controlplanev1.ManagedRunner], error) {
	halts, err := s.activeHalts(ctx, targets, org)
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

// channelRollouts is each channel's rollout state as the caller sees it, STABLE first:
// its own organization's halts, and for a platform admin how many organizations are
// halted.
func (s *Service) channelRollouts(ctx context.Context, targets map[string]string) ([]*controlplanev1.ChannelRollout, error) {
	p := principal(ctx)
	halts, err := s.activeHalts(ctx, targets, p.Org)
	if err != nil {
		return nil, err
	}
	counts, err := s.haltedOrgs(ctx, targets)
	if err != nil {
		return nil, err
	}
	var out []*controlplanev1.ChannelRollout
	for _, ch := range []string{store.ChannelStable, store.ChannelRapid} {
		out = append(out, channelRollout(ch, targets[ch], halts, counts))
	}
	return out, nil
}

// haltedOrgs counts, by channel, the organizations whose rollout of the channel's target is
// halted, for a platform admin (nil for anyone else: a tenant learns nothing of others).
func (s *Service) haltedOrgs(ctx context.Context, targets map[string]string) (map[string]int32, error) {
	if p := principal(ctx); p.Role != auth.RoleAdmin || p.Org != s.platform {
		return nil, nil
	}
	hs, err := s.st.Rollouts().Halts(ctx, "")
	if err != nil {
		return nil, storeErr(err)
	}
	out := map[string]int32{}
	for _, h := range hs {
		if t := targets[h.Channel]; t != "" && t == h.Version {
			out[h.Channel]++
		}
	}
	return out, nil
}

func channelRollout(ch, target string, halts map[string]store.RolloutHalt, counts map[string]int32) *controlplanev1.ChannelRollout {
	c := &controlplanev1.ChannelRollout{Channel: channelProto(ch), TargetVersion: target, State: controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE,
		HaltedOrganizations: counts[ch]}
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

// ResumeRollout lifts a channel's halt for one organization (organization_id) or for every
// organization (empty). Platform admins only: like a publish, it decides what an
// organization's runners are moved to, and a tenant must not override the halt its own
// runner's failure caused without the operator.
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
	org := req.Msg.GetOrganizationId()
	if len(org) > 128 {
		vs.add("organization_id", "must be at most 128 bytes")
	}
	if err := vs.err("invalid resume request"); err != nil {
		return nil, err
	}
	if org != "" {
		if _, err := s.st.Orgs().Get(ctx, org); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				vs.add("organization_id", "no organization %q", org)
				return nil, vs.err("invalid resume request")
			}
			return nil, storeErr(err)
		}
	}
	resumed, err := s.st.Rollouts().Resume(ctx, org, ch)
	if err != nil {
		return nil, storeErr(err)
	}
	targets, err := s.channelTargets(ctx)
	if err != nil {
		return nil, err
	}
	p := principal(ctx)
	s.log.Info("rollout resumed", "channel", ch, "for_org", org, "halts_lifted", resumed, "org", p.Org, "key", p.KeyID)
	ros, err := s.channelRollouts(ctx, targets)
	if err != nil {
		return nil, err
	}
	for _, r := range ros {
		if r.GetChannel() == channelProto(ch) {
			return connect.NewResponse(r), nil
		}
	}
	return connect.NewResponse(channelRollout(ch, targets[ch], nil, nil)), nil
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
