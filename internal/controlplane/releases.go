package controlplane

import (
	"context"
	"crypto/ed25519"
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
	"github.com/sandboxd/sandboxd/internal/textclip"
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

// ValidateRelease checks a release record to publish (the unsigned way) and returns its
// store record.
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
	checkChecksums(&vs, "release.binary_checksums", r.GetBinaryChecksums())
	checkChecksums(&vs, "release.agent_binary_checksums", r.GetAgentBinaryChecksums())
	checkOutputOnly(&vs, r)
	if err := vs.err("invalid release"); err != nil {
		return store.Release{}, err
	}
	return store.Release{Version: r.GetVersion(), RunnerImageDigest: r.GetRunnerImageDigest(),
		AgentImageDigest: r.GetAgentImageDigest(), BinaryChecksums: cloneOrNil(r.GetBinaryChecksums()),
		AgentBinaryChecksums: cloneOrNil(r.GetAgentBinaryChecksums())}, nil
}

// checkChecksums checks an architecture -> hex SHA-256 map.
func checkChecksums(vs *violations, field string, sums map[string]string) {
	for _, arch := range slices.Sorted(maps.Keys(sums)) {
		f := fmt.Sprintf("%s[%q]", field, arch)
		if err := release.CheckArch(arch); err != nil {
			vs.add(f, "%v", err)
			continue
		}
		if err := release.CheckChecksum(sums[arch]); err != nil {
			vs.add(f, "%v", err)
		}
	}
}

// checkOutputOnly refuses the fields of a Release the control plane sets.
func checkOutputOnly(vs *violations, r *controlplanev1.Release) {
	if len(r.GetChannels()) > 0 {
		vs.add("release.channels", "is output only: a published release is on RAPID; PromoteRelease puts it on STABLE")
	}
	if len(r.GetManifest()) > 0 || len(r.GetManifestSignature()) > 0 {
		vs.add("release.manifest", "is output only: send a signed manifest as PublishReleaseRequest.manifest and .signature")
	}
}

func cloneOrNil(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// ValidatePublish checks a PublishReleaseRequest against the trusted release keys and
// returns the store record to publish. A request carries a record or a signed manifest:
//   - keys configured: only a signed manifest whose signature one of them verifies
//     (CWSANDBOX_RELEASE_SIGNATURE_REQUIRED for a record, _SIGNATURE_INVALID for a
//     signature none verifies); the record is the manifest's, kept with its bytes and
//     signature. Nothing in the manifest is parsed before its signature verifies.
//   - no keys: only a record (CWSANDBOX_RELEASE_KEYS_NOT_CONFIGURED for a manifest: a
//     signature nobody checked would be shown as one that was).
//
// With a manifest, release may be sent too (a client that fills both), but each of its
// fields must then equal the manifest's: a conflict is a field violation, never a silent
// choice of one over the other.
func ValidatePublish(keys []ed25519.PublicKey, req *controlplanev1.PublishReleaseRequest) (store.Release, error) {
	manifest, sig := req.GetManifest(), req.GetSignature()
	if len(manifest) == 0 && len(sig) == 0 {
		if len(keys) > 0 {
			return store.Release{}, apierr.New(apierr.ReleaseSignatureRequired,
				"this control plane publishes only signed release manifests (it trusts release keys): sign one with `sandboxd release sign` and send it with its signature", nil)
		}
		return ValidateRelease(req.GetRelease())
	}
	if len(keys) == 0 {
		return store.Release{}, apierr.New(apierr.ReleaseKeysNotConfigured,
			"this control plane trusts no release key (sandboxd controlplane --release-keys), so it cannot verify a signed manifest; publish a record instead, or configure the keys", nil)
	}
	var vs violations
	switch {
	case len(manifest) == 0:
		vs.add("manifest", "is required with a signature")
	case len(manifest) > release.MaxManifestBytes:
		vs.add("manifest", "is %d bytes; at most %d", len(manifest), release.MaxManifestBytes)
	}
	if len(sig) != ed25519.SignatureSize {
		vs.add("signature", "must be an Ed25519 signature: %d bytes, raw (got %d)", ed25519.SignatureSize, len(sig))
	}
	if err := vs.err("invalid signed release"); err != nil {
		return store.Release{}, err
	}
	m, err := release.Verify(keys, manifest, sig)
	if errors.Is(err, release.ErrBadSignature) {
		return store.Release{}, apierr.New(apierr.ReleaseSignatureInvalid,
			"the release manifest's signature does not verify with any of this control plane's trusted release keys (tampered, or signed with another key)", nil)
	}
	var me release.ManifestError
	switch {
	case errors.As(err, &me):
		for _, fe := range me {
			vs.add("manifest."+fe.Field, "%s", fe.Problem)
		}
	case err != nil:
		vs.add("manifest", "%v", err)
	}
	if err := vs.err("invalid release manifest"); err != nil {
		return store.Release{}, err
	}
	rec := store.Release{Version: m.Version, RunnerImageDigest: m.RunnerImageDigest, AgentImageDigest: m.AgentImageDigest,
		Manifest: slices.Clone(manifest), ManifestSignature: slices.Clone(sig)}
	for _, arch := range slices.Sorted(maps.Keys(m.Binaries)) {
		b := m.Binaries[arch]
		rec.BinaryChecksums = setKey(rec.BinaryChecksums, arch, b.Sandboxd)
		if b.Agent != "" {
			rec.AgentBinaryChecksums = setKey(rec.AgentBinaryChecksums, arch, b.Agent)
		}
	}
	if r := req.GetRelease(); r != nil {
		conflicts(&vs, "release.version", r.GetVersion(), rec.Version)
		conflicts(&vs, "release.runner_image_digest", r.GetRunnerImageDigest(), rec.RunnerImageDigest)
		conflicts(&vs, "release.agent_image_digest", r.GetAgentImageDigest(), rec.AgentImageDigest)
		if len(r.GetBinaryChecksums()) > 0 && !maps.Equal(r.GetBinaryChecksums(), rec.BinaryChecksums) {
			vs.add("release.binary_checksums", "conflicts with the signed manifest's binaries (leave it empty: the record is the manifest's)")
		}
		if len(r.GetAgentBinaryChecksums()) > 0 && !maps.Equal(r.GetAgentBinaryChecksums(), rec.AgentBinaryChecksums) {
			vs.add("release.agent_binary_checksums", "conflicts with the signed manifest's binaries (leave it empty: the record is the manifest's)")
		}
		checkOutputOnly(&vs, r)
	}
	if err := vs.err("the request conflicts with its signed release manifest"); err != nil {
		return store.Release{}, err
	}
	return rec, nil
}

func setKey(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

// conflicts adds a violation when a field was sent and differs from the manifest's.
func conflicts(vs *violations, field, got, manifest string) {
	if got != "" && got != manifest {
		vs.add(field, "is %q but the signed manifest says %q (leave it empty: the record is the manifest's)", textclip.Clip(got, 80), manifest)
	}
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
	p := principal(ctx)
	rec, err := ValidatePublish(s.relKeys, req.Msg)
	if err != nil {
		if r := apierr.Reason(err); r == apierr.ReleaseSignatureInvalid {
			s.log.Warn("release refused: its manifest's signature does not verify with any trusted key", "org", p.Org, "key", p.KeyID)
		}
		return nil, err
	}
	out, err := s.st.Releases().Publish(ctx, rec)
	if err != nil {
		return nil, releaseErr(rec.Version, err)
	}
	s.log.Info("release published", "version", out.Version, "channel", store.ChannelRapid, "signed", out.Manifest != nil, "org", p.Org, "key", p.KeyID)
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
		// The manifest and signature exactly as published, so that whoever reads the
		// release can verify it with the platform's public keys instead of trusting us.
		AgentBinaryChecksums: maps.Clone(r.AgentBinaryChecksums),
		Manifest:             slices.Clone(r.Manifest),
		ManifestSignature:    slices.Clone(r.ManifestSignature),
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

// GetRelease is RunnerRegistrationService.GetRelease: any registered runner (its client
// certificate, as for Heartbeat) may read one release with its signed manifest, to verify
// it before it installs the release. Releases are platform-wide, so the runner's
// organization does not matter.
func (g *Registration) GetRelease(ctx context.Context, req *connect.Request[controlplanev1.GetReleaseRequest]) (*connect.Response[controlplanev1.Release], error) {
	org, id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	// A certificate outlives its runner's record: a deleted runner reads nothing more.
	if _, err := g.s.st.Runners().Get(ctx, org, id); err != nil {
		return nil, runnerErr(id, "", err)
	}
	v := req.Msg.GetVersion()
	if _, err := release.ParseVersion(v); err != nil {
		var vs violations
		vs.add("version", "%v", err)
		return nil, vs.err("invalid version")
	}
	r, err := g.s.st.Releases().Get(ctx, v)
	if err != nil {
		return nil, releaseErr(v, err)
	}
	return connect.NewResponse(releaseProto(r)), nil
}
