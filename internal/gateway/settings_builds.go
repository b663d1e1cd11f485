package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// SettingsService's build storage config (issue 22; docs/builds.md, "Build storage
// settings"). Mode MANAGED (the default): an organization's images are the repositories
// under its prefix (registry_namespace, "<registry host>/<org>") of the platform
// registry, stored in the platform's storage, and its build context objects live in the
// gateway's blob store (effective_bucket_name). Mode CUSTOMER_OWNED
// (settings_buildown.go): the same repositories, stored in the organization's own S3
// bucket (bucket_name at location, an endpoint the platform allows), checked by a probe
// before the update is stored. enabled (false refuses StartBuild and Compose builds,
// CWSANDBOX_BUILD_NOT_SUPPORTED) and billing_reference (kept and shown) apply to both.
// registry_namespace accepts only what it is (or empty).

// Field names of UpdateBuildStorageConfigRequest, for violations.
const (
	bscField = "build_storage_config"
	// maxBillingReference bounds billing_reference (bytes).
	maxBillingReference = 128
)

// bscSettable are the fields update_mask may name; bscOutputOnly those it may not.
var (
	bscSettable   = []string{"enabled", "mode", "bucket_name", "location", "registry_namespace", "billing_reference"}
	bscOutputOnly = map[string]bool{"etag": true, "revision": true, "effective_bucket_name": true}
)

// buildStorage is the build storage settings store (nil: every organization has the
// defaults and UpdateBuildStorageConfig is UNIMPLEMENTED).
func (s *Server) buildStorage() store.BuildStorageConfigs {
	if s.builds == nil {
		return nil
	}
	return s.builds.cfg.Settings
}

// buildStorageConfig is org's stored config, or the defaults (enabled, revision 0).
func (s *Server) buildStorageConfig(ctx context.Context, org string) (store.BuildStorageConfig, error) {
	def := store.BuildStorageConfig{Org: org, Enabled: true, Mode: int32(sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED)}
	st := s.buildStorage()
	if st == nil {
		return def, nil
	}
	c, err := st.Get(ctx, org)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return def, nil
	case err != nil:
		return store.BuildStorageConfig{}, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "the build storage settings cannot be read or written now: %v", err), 5*time.Second)
	}
	return c, nil
}

// buildRegistryNamespace is org's repository prefix in the platform registry ("" when
// the gateway has none).
func (s *Server) buildRegistryNamespace(org string) string {
	if s.builds == nil || s.builds.cfg.RegistryHost == "" {
		return ""
	}
	return s.builds.cfg.RegistryHost + "/" + org
}

// buildBucket is the bucket of the gateway's blob store, where build context objects
// live ("" when the gateway has no blob store).
func (s *Server) buildBucket() string {
	if s.blobs == nil {
		return ""
	}
	return s.snapBucket
}

func buildStorageEtag(revision int64) string { return "r" + strconv.FormatInt(revision, 10) }

// buildStorageProto is c as the API shows it.
func (s *Server) buildStorageProto(c store.BuildStorageConfig) *sandboxv1.BuildStorageConfig {
	out := &sandboxv1.BuildStorageConfig{
		Enabled:             c.Enabled,
		Mode:                sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED,
		RegistryNamespace:   s.buildRegistryNamespace(c.Org),
		BillingReference:    c.BillingReference,
		Etag:                buildStorageEtag(c.Revision),
		Revision:            c.Revision,
		EffectiveBucketName: s.buildBucket(),
	}
	if customerOwned(c.Mode) {
		out.Mode = sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED
		out.BucketName, out.Location, out.EffectiveBucketName = c.Bucket, c.Location, c.Bucket
	}
	return out
}

// effectiveBucket is c's effective_bucket_name.
func (s *Server) effectiveBucket(c store.BuildStorageConfig) string {
	if customerOwned(c.Mode) {
		return c.Bucket
	}
	return s.buildBucket()
}

// GetBuildStorageConfig returns the caller's organization's build storage settings: the
// defaults (enabled, MANAGED, revision 0) until an administrator sets them.
func (s *Server) GetBuildStorageConfig(ctx context.Context, _ *connect.Request[sandboxv1.GetBuildStorageConfigRequest]) (*connect.Response[sandboxv1.BuildStorageConfig], error) {
	c, err := s.buildStorageConfig(ctx, principal(ctx).Org)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(s.buildStorageProto(c)), nil
}

// UpdateBuildStorageConfig changes the fields update_mask names (SANDBOX_ADMIN only); no
// mask or "*" replaces every settable field. A non-empty etag, or a non-zero revision, in
// the body must be the current one (else ABORTED CWSANDBOX_ETAG_MISMATCH, like template
// updates); the update makes revision + 1. etag, revision and effective_bucket_name are
// output only: named in the mask they are INVALID_ARGUMENT, and effective_bucket_name set
// to anything but what it is, too.
func (s *Server) UpdateBuildStorageConfig(ctx context.Context, req *connect.Request[sandboxv1.UpdateBuildStorageConfigRequest]) (*connect.Response[sandboxv1.BuildStorageConfig], error) {
	if err := requireAdmin(ctx, "UpdateBuildStorageConfig"); err != nil {
		return nil, err
	}
	st := s.buildStorage()
	if st == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "the build storage settings need a store (this gateway has none)")
	}
	org := principal(ctx).Org
	in := req.Msg.GetBuildStorageConfig()
	if in == nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, bscField+" is required", []apierr.Violation{{Field: bscField, Description: "is required"}})
	}
	set, vs := bscUpdateMask(req.Msg.GetUpdateMask().GetPaths())
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid update_mask: "+apierr.Describe(vs), vs)
	}
	cur, err := s.buildStorageConfig(ctx, org)
	if err != nil {
		return nil, err
	}
	if e := in.GetEtag(); e != "" && e != buildStorageEtag(cur.Revision) {
		return nil, bscEtagMismatch(e, cur.Revision)
	}
	if r := in.GetRevision(); r != 0 && r != cur.Revision {
		return nil, bscEtagMismatch(buildStorageEtag(r), cur.Revision)
	}
	next := cur
	if set["enabled"] {
		next.Enabled = in.GetEnabled()
	}
	if set["billing_reference"] {
		next.BillingReference = in.GetBillingReference()
	}
	if set["mode"] {
		next.Mode = int32(sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED)
		if in.GetMode() == sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED {
			next.Mode = int32(in.GetMode())
		}
	}
	if set["bucket_name"] {
		next.Bucket = in.GetBucketName()
	}
	if set["location"] {
		next.Location = in.GetLocation()
	}
	vs = s.bscViolations(org, in, set, customerOwned(next.Mode))
	if e := in.GetEffectiveBucketName(); e != "" && e != s.effectiveBucket(cur) && e != s.effectiveBucket(next) {
		vs = append(vs, apierr.Violation{Field: bscField + ".effective_bucket_name", Description: "is output only; leave it unset"})
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
	}
	if customerOwned(next.Mode) {
		// Checked (and the bucket probed) whenever the update touches the storage.
		if set["mode"] || set["bucket_name"] || set["location"] {
			if err := s.checkOwnStorage(ctx, org, &next); err != nil {
				return nil, err
			}
		}
	} else {
		// MANAGED: no own bucket is kept (bucket_name may name the platform's bucket).
		next.Bucket, next.Location = "", ""
	}
	out, err := st.Put(ctx, next, cur.Revision)
	switch {
	case errors.Is(err, store.ErrConflict):
		now, gerr := s.buildStorageConfig(ctx, org)
		if gerr != nil {
			return nil, gerr
		}
		return nil, bscEtagMismatch(buildStorageEtag(cur.Revision), now.Revision)
	case err != nil:
		return nil, apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "the build storage settings cannot be written now: %v", err), 5*time.Second)
	}
	if f := s.builds.cfg.OnStorageChange; f != nil {
		f(org)
	}
	s.log.Info("build storage config updated", "org", org, "revision", out.Revision, "enabled", out.Enabled, "mode", sandboxv1.BuildStorageMode(out.Mode).String(), "bucket", out.Bucket, "location", out.Location)
	return connect.NewResponse(s.buildStorageProto(out)), nil
}

// bscUpdateMask reads update_mask's paths: which fields the update sets.
func bscUpdateMask(paths []string) (map[string]bool, []apierr.Violation) {
	set := map[string]bool{}
	all := func() {
		for _, f := range bscSettable {
			set[f] = true
		}
	}
	if len(paths) == 0 {
		all()
		return set, nil
	}
	var vs []apierr.Violation
	for _, p := range paths {
		switch {
		case p == "*":
			all()
		case bscOutputOnly[p]:
			vs = append(vs, apierr.Violation{Field: "update_mask", Description: fmt.Sprintf("%q is output only", p)})
		case slices.Contains(bscSettable, p):
			set[p] = true
		default:
			vs = append(vs, apierr.Violation{Field: "update_mask", Description: fmt.Sprintf("%q is not a field of BuildStorageConfig (%s)", textclip.Clip(p, 64), strings.Join(bscSettable, ", "))})
		}
	}
	return set, vs
}

// bscViolations checks the settable fields the update sets for shape (own is the mode
// the update results in: CUSTOMER_OWNED); billing_reference is bounded text. Whether an
// own storage can be used is checkOwnStorage's.
func (s *Server) bscViolations(org string, in *sandboxv1.BuildStorageConfig, set map[string]bool, own bool) []apierr.Violation {
	var vs []apierr.Violation
	add := func(field, desc string) {
		vs = append(vs, apierr.Violation{Field: bscField + "." + field, Description: desc})
	}
	if set["mode"] {
		switch m := in.GetMode(); m {
		case sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_UNSPECIFIED, sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_MANAGED,
			sandboxv1.BuildStorageMode_BUILD_STORAGE_MODE_CUSTOMER_OWNED:
		default:
			add("mode", fmt.Sprintf("%d is not a BuildStorageMode", int32(m)))
		}
	}
	if b := in.GetBucketName(); set["bucket_name"] && b != "" {
		switch {
		case own:
			if why := s3.BucketNameProblem(b); why != "" {
				add("bucket_name", fmt.Sprintf("%q: %s", textclip.Clip(b, 64), why))
			}
		case b != s.buildBucket():
			add("bucket_name", fmt.Sprintf("%q: with mode MANAGED builds use the platform's bucket (%q, effective_bucket_name); an own bucket needs mode CUSTOMER_OWNED", textclip.Clip(b, 64), s.buildBucket()))
		}
	}
	if l := in.GetLocation(); set["location"] && l != "" {
		switch {
		case !own:
			add("location", fmt.Sprintf("%q: with mode MANAGED there is no location to choose; leave it empty", textclip.Clip(l, 64)))
		default:
			if why := locationProblem(l); why != "" {
				add("location", why)
			}
		}
	}
	if n, want := in.GetRegistryNamespace(), s.buildRegistryNamespace(org); set["registry_namespace"] && n != "" && n != want {
		add("registry_namespace", fmt.Sprintf("%q: the organization's images are pushed under %q in the platform registry, which cannot be changed; leave it empty", textclip.Clip(n, 64), want))
	}
	if b := in.GetBillingReference(); set["billing_reference"] {
		switch {
		case len(b) > maxBillingReference:
			add("billing_reference", fmt.Sprintf("is %d bytes, at most %d", len(b), maxBillingReference))
		case !textclip.AllPrintable(b):
			add("billing_reference", "must be printable UTF-8 text")
		}
	}
	return vs
}

func bscEtagMismatch(asked string, current int64) error {
	cur := buildStorageEtag(current)
	return apierr.New(apierr.EtagMismatch, fmt.Sprintf("the build storage config is at etag %s (revision %d), not %s: read it again", cur, current, textclip.Clip(asked, 64)),
		map[string]string{"etag": textclip.Clip(asked, 64), "current_etag": cur})
}

// buildsEnabled refuses a build of org when its build storage config disables builds.
func (s *Server) buildsEnabled(ctx context.Context, org string) error {
	c, err := s.buildStorageConfig(ctx, org)
	if err != nil {
		return err
	}
	if !c.Enabled {
		return apierr.New(apierr.BuildNotSupported,
			"image builds are disabled for this organization by its build storage config (enabled: false; an administrator turns them on with UpdateBuildStorageConfig)",
			map[string]string{"setting": bscField + ".enabled"})
	}
	return nil
}
