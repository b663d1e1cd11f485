package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Releases are platform-wide: every organization's runners follow the same channels. So
// any admin may list them, but only an admin of the platform organization may publish or
// promote one: organizations are tenants, and no tenant may change what another's runners
// are told to run.

// requirePlatformAdmin refuses a principal that is not an admin of the platform
// organization (PERMISSION_DENIED), and logs the attempt.
func (s *Service) requirePlatformAdmin(ctx context.Context, call string) error {
	p := principal(ctx)
	if p.Role == auth.RoleAdmin && p.Org == s.platform {
		return nil
	}
	s.log.Warn("release change refused: not an admin of the platform organization", "call", call, "org", p.Org, "key", p.KeyID)
	return apierr.New(apierr.PermissionDenied,
		"releases are the platform operator's: only an admin key of the platform organization may publish or promote them", nil)
}

// channelTargets returns the version each release channel offers (targetsOf the
// stored releases), with the store's errors as the runner calls answer them.
func (s *Service) channelTargets(ctx context.Context) (map[string]string, error) {
	rs, err := s.st.Releases().List(ctx)
	if err != nil {
		return nil, storeErr(err)
	}
	return s.targetsOf(rs), nil
}

// targetsOf is the version each release channel offers given the release records rs:
// from them when there are any (a channel none is on offers nothing), else the
// configured TargetVersions.
func (s *Service) targetsOf(rs []store.Release) map[string]string {
	if len(rs) == 0 {
		return s.targets
	}
	return store.CurrentVersions(rs)
}

// ValidateRelease checks a release to publish and returns its store record.
func ValidateRelease(r *controlplanev1.Release) (store.Release, error) {
	var vs violations
	if r == nil {
		vs.add("release", "is required")
		return store.Release{}, vs.err("release is required")
	}
	if _, err := release.ParseVersion(r.GetVersion()); err != nil {
		vs.add("release.version", "%v", err)
	}
	if err := release.CheckDigest(r.GetRunnerImageDigest()); err != nil {
		vs.add("release.runner_image_digest", "%v", err)
	}
	if err := release.CheckDigest(r.GetAgentImageDigest()); err != nil {
		vs.add("release.agent_image_digest", "%v", err)
	}
	sums := r.GetBinaryChecksums()
	for _, arch := range slices.Sorted(maps.Keys(sums)) {
		field := fmt.Sprintf("release.binary_checksums[%q]", arch)
		if err := release.CheckArch(arch); err != nil {
			vs.add(field, "%v", err)
			continue
		}
		if err := release.CheckChecksum(sums[arch]); err != nil {
			vs.add(field, "%v", err)
		}
	}
	if len(r.GetChannels()) > 0 {
		vs.add("release.channels", "is output only: a published release is on RAPID; PromoteRelease puts it on STABLE")
	}
	if err := vs.err("invalid release"); err != nil {
		return store.Release{}, err
	}
	var out map[string]string
	if len(sums) > 0 {
		out = maps.Clone(sums)
	}
	return store.Release{Version: r.GetVersion(), RunnerImageDigest: r.GetRunnerImageDigest(),
		AgentImageDigest: r.GetAgentImageDigest(), BinaryChecksums: out}, nil
}

func (s *Service) ListReleases(ctx context.Context, _ *connect.Request[controlplanev1.ListReleasesRequest]) (*connect.Response[controlplanev1.ListReleasesResponse], error) {
	rs, err := s.st.Releases().List(ctx)
	if err != nil {
		return nil, storeErr(err)
	}
	targets := s.targetsOf(rs)
	out := &controlplanev1.ListReleasesResponse{StableVersion: targets[store.ChannelStable], RapidVersion: targets[store.ChannelRapid]}
	if out.Rollouts, err = s.channelRollouts(ctx, targets); err != nil {
		return nil, err
	}
	for _, r := range rs {
		out.Releases = append(out.Releases, releaseProto(r))
	}
	return connect.NewResponse(out), nil
}

func (s *Service) PublishRelease(ctx context.Context, req *connect.Request[controlplanev1.PublishReleaseRequest]) (*connect.Response[controlplanev1.Release], error) {
	if err := s.requirePlatformAdmin(ctx, "PublishRelease"); err != nil {
		return nil, err
	}
	rec, err := ValidateRelease(req.Msg.GetRelease())
	if err != nil {
		return nil, err
	}
	out, err := s.st.Releases().Publish(ctx, rec)
	if err != nil {
		return nil, releaseErr(rec.Version, err)
	}
	p := principal(ctx)
	s.log.Info("release published", "version", out.Version, "channel", store.ChannelRapid, "org", p.Org, "key", p.KeyID)
	return connect.NewResponse(releaseProto(out)), nil
}

func (s *Service) PromoteRelease(ctx context.Context, req *connect.Request[controlplanev1.PromoteReleaseRequest]) (*connect.Response[controlplanev1.Release], error) {
	if err := s.requirePlatformAdmin(ctx, "PromoteRelease"); err != nil {
		return nil, err
	}
	v := req.Msg.GetVersion()
	if _, err := release.ParseVersion(v); err != nil {
		var vs violations
		vs.add("version", "%v", err)
		return nil, vs.err("invalid version")
	}
	out, err := s.st.Releases().Promote(ctx, v)
	if err != nil {
		return nil, releaseErr(v, err)
	}
	p := principal(ctx)
	s.log.Info("release promoted", "version", out.Version, "channel", store.ChannelStable, "org", p.Org, "key", p.KeyID)
	return connect.NewResponse(releaseProto(out)), nil
}

// releaseErr maps a store error of a release call to the API's.
func releaseErr(version string, err error) error {
	meta := map[string]string{"version": version}
	switch {
	case errors.Is(err, store.ErrAlreadyExists):
		return apierr.New(apierr.AlreadyExists, fmt.Sprintf("release %s is recorded already (a version is published once)", version), meta)
	case errors.Is(err, store.ErrNotFound):
		return apierr.New(apierr.ReleaseNotFound, fmt.Sprintf("release %s not found: publish it first", version), meta)
	case errors.Is(err, store.ErrNotOnRapid):
		return apierr.New(apierr.ReleaseNotPromotable,
			fmt.Sprintf("release %s is not on RAPID: a version reaches STABLE only after RAPID", version), meta)
	case errors.Is(err, store.ErrOlderThanStable):
		return apierr.New(apierr.ReleaseNotPromotable,
			fmt.Sprintf("cannot promote: %v; STABLE only moves forward", err), meta)
	}
	return storeErr(err)
}

// storeErr maps the errors any store call may return.
func storeErr(err error) error {
	switch {
	case errors.Is(err, store.ErrInvalid):
		return apierr.Newf(apierr.InvalidRequest, "%v", err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return apierr.Newf(apierr.ControlPlaneUnavailable, "control plane store: %v", err)
}

func releaseProto(r store.Release) *controlplanev1.Release {
	out := &controlplanev1.Release{
		Version:           r.Version,
		RunnerImageDigest: r.RunnerImageDigest,
		AgentImageDigest:  r.AgentImageDigest,
		BinaryChecksums:   maps.Clone(r.BinaryChecksums),
		CreateTime:        timestamppb.New(r.CreatedAt),
	}
	for _, ch := range r.Channels() {
		if ch == store.ChannelStable {
			out.Channels = append(out.Channels, controlplanev1.ReleaseChannel_STABLE)
		} else {
			out.Channels = append(out.Channels, controlplanev1.ReleaseChannel_RAPID)
		}
	}
	if r.RapidAt != nil {
		out.RapidTime = timestamppb.New(*r.RapidAt)
	}
	if r.StableAt != nil {
		out.StableTime = timestamppb.New(*r.StableAt)
	}
	return out
}
