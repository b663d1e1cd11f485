package gateway

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// SettingsService's file-system snapshot bucket config (issue 20). An organization's
// snapshots go to the platform's bucket (mode CW_MANAGED, the platform blob store's:
// FSSOptions.PlatformBucket) unless an administrator names the organization's own bucket
// (BRING_YOUR_OWN). An own bucket is reached with the platform store's endpoint and
// credentials, so it is only possible when that store is S3 (FSSOptions.ProbeBucket is
// set) and the bucket exists and can be listed with them; a bucket is one organization's
// (no organization writes into another's). Snapshots already taken stay where they are
// (FileSystemSnapshot.object_bucket); restoring one from a bucket that is no longer the
// organization's fails CWSANDBOX_FSS_BUCKET_MISMATCH (checkRestoreBucket). Runners write
// and read an own bucket's archives with their S3 store's endpoint and credentials
// (SnapshotTarget.Bucket, SnapshotSource.Bucket); the gateway checks and deletes them
// likewise (blobconfig.Buckets).

// FSSOptions configures the file-system snapshot parts around the snapshot RPCs: limits,
// the garbage collector, and the organizations' bucket settings.
type FSSOptions struct {
	Limits SnapshotLimits
	GC     FSSGCConfig
	// PlatformBucket names the platform blob store's bucket (blobconfig.Config.Bucket():
	// "local" for a directory store, the default).
	PlatformBucket string
	// BucketConfigs keeps the organizations' own buckets; nil: every organization uses
	// the platform's and UpdateFileSystemSnapshotBucketConfig accepts only clearing it.
	BucketConfigs store.FSSBucketConfigs
	// ProbeBucket checks that a bucket is usable with the platform store's endpoint and
	// credentials (blobconfig.Config.BucketProber); nil: the platform store is not S3, and
	// an organization's own bucket is refused CWSANDBOX_FSS_BUCKET_UNAVAILABLE.
	ProbeBucket BucketProber
}

// BucketProber checks that bucket (in region, "" for the store's) exists and can be
// listed with the platform store's endpoint and credentials.
type BucketProber func(ctx context.Context, bucket, region string) error

// bucketProbeTimeout bounds one BucketProber call.
const bucketProbeTimeout = 10 * time.Second

// Field names of UpdateFileSystemSnapshotBucketConfigRequest, for violations.
const (
	fssConfigField = "file_system_snapshot_bucket_config"
	fssBucketField = fssConfigField + ".bucket_name"
	fssRegionField = fssConfigField + ".region"
)

// GetFileSystemSnapshotBucketConfig returns the caller's organization's bucket config.
func (s *Server) GetFileSystemSnapshotBucketConfig(ctx context.Context, _ *connect.Request[sandboxv1.GetFileSystemSnapshotBucketConfigRequest]) (*connect.Response[sandboxv1.FileSystemSnapshotBucketConfig], error) {
	c, err := s.fssBucketConfig(ctx, principal(ctx).Org)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(s.fssBucketConfigProto(c)), nil
}

// UpdateFileSystemSnapshotBucketConfig sets or clears the organization's own bucket
// (SANDBOX_ADMIN only). update_mask names bucket_name and/or region; no mask (what the
// official client sends) or "*" replaces both. An empty bucket_name goes back to the
// platform's bucket (CW_MANAGED). mode and effective_bucket_name are output only: named
// in the mask, or set in the body to something other than what the update results in,
// they are INVALID_ARGUMENT.
func (s *Server) UpdateFileSystemSnapshotBucketConfig(ctx context.Context, req *connect.Request[sandboxv1.UpdateFileSystemSnapshotBucketConfigRequest]) (*connect.Response[sandboxv1.FileSystemSnapshotBucketConfig], error) {
	p := principal(ctx)
	if p.Role != auth.RoleAdmin {
		return nil, apierr.New(apierr.PermissionDenied, "UpdateFileSystemSnapshotBucketConfig needs an API key of role "+string(auth.RoleAdmin), nil)
	}
	in := req.Msg.GetFileSystemSnapshotBucketConfig()
	if in == nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, fssConfigField+" is required", []apierr.Violation{{Field: fssConfigField, Description: "is required"}})
	}
	setBucket, setRegion, vs := fssUpdateMask(req.Msg.GetUpdateMask().GetPaths())
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "update_mask: "+apierr.Describe(vs), vs)
	}
	cur, err := s.fssBucketConfig(ctx, p.Org)
	if err != nil {
		return nil, err
	}
	next := cur
	if setBucket {
		next.Bucket = in.GetBucketName()
	}
	if setRegion {
		next.Region = in.GetRegion()
	}
	if next.Bucket == "" && !setRegion {
		next.Region = "" // clearing the bucket clears its region
	}
	next.Org = p.Org
	want := s.fssBucketConfigProto(next)
	vs = fssBucketViolations(next, s.fss.PlatformBucket)
	if m := in.GetMode(); m != sandboxv1.FileSystemSnapshotBucketMode_FILE_SYSTEM_SNAPSHOT_BUCKET_MODE_UNSPECIFIED && m != want.GetMode() {
		vs = append(vs, apierr.Violation{Field: fssConfigField + ".mode", Description: "is output only (" + want.GetMode().String() + " after this update); leave it unset"})
	}
	if e := in.GetEffectiveBucketName(); e != "" && e != want.GetEffectiveBucketName() {
		vs = append(vs, apierr.Violation{Field: fssConfigField + ".effective_bucket_name", Description: "is output only; leave it unset"})
	}
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
	}

	if next.Bucket == "" {
		if s.fss.BucketConfigs != nil {
			if err := s.fss.BucketConfigs.Delete(ctx, p.Org); err != nil {
				return nil, fssStoreUnavailable(err)
			}
		}
		return connect.NewResponse(want), nil
	}
	if next.Bucket == cur.Bucket && next.Region == cur.Region {
		return connect.NewResponse(want), nil // unchanged: no probe
	}
	if s.fss.BucketConfigs == nil || s.fss.ProbeBucket == nil {
		return nil, apierr.New(apierr.FSSBucketUnavailable,
			"this deployment keeps snapshots in its own object store only: an organization's own bucket needs an S3 platform store", map[string]string{"bucket_name": next.Bucket})
	}
	pctx, cancel := context.WithTimeout(ctx, bucketProbeTimeout)
	err = s.fss.ProbeBucket(pctx, next.Bucket, next.Region)
	cancel()
	if err != nil {
		return nil, apierr.New(apierr.FSSBucketUnavailable,
			fmt.Sprintf("bucket %s cannot be used with the platform's object store credentials: %s", next.Bucket, textclip.Clip(err.Error(), 300)),
			map[string]string{"bucket_name": next.Bucket})
	}
	if _, err := s.fss.BucketConfigs.Put(ctx, store.FSSBucketConfig{Org: p.Org, Bucket: next.Bucket, Region: next.Region}); err != nil {
		if errors.Is(err, store.ErrAlreadyExists) {
			return nil, apierr.New(apierr.FSSBucketUnavailable,
				"bucket "+next.Bucket+" is another organization's snapshot bucket", map[string]string{"bucket_name": next.Bucket})
		}
		return nil, fssStoreUnavailable(err)
	}
	return connect.NewResponse(want), nil
}

// fssUpdateMask reads update_mask's paths: which fields the update sets.
func fssUpdateMask(paths []string) (bucket, region bool, vs []apierr.Violation) {
	if len(paths) == 0 {
		return true, true, nil
	}
	for _, p := range paths {
		switch p {
		case "*":
			bucket, region = true, true
		case "bucket_name":
			bucket = true
		case "region":
			region = true
		case "mode", "effective_bucket_name":
			vs = append(vs, apierr.Violation{Field: "update_mask", Description: fmt.Sprintf("%q is output only", p)})
		default:
			vs = append(vs, apierr.Violation{Field: "update_mask", Description: fmt.Sprintf("%q is not a field of FileSystemSnapshotBucketConfig (bucket_name, region)", textclip.Clip(p, 64))})
		}
	}
	return bucket, region, vs
}

// fssBucketConfig is org's stored config (Bucket "" for the platform's).
func (s *Server) fssBucketConfig(ctx context.Context, org string) (store.FSSBucketConfig, error) {
	if s.fss.BucketConfigs == nil {
		return store.FSSBucketConfig{Org: org}, nil
	}
	c, err := s.fss.BucketConfigs.Get(ctx, org)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.FSSBucketConfig{Org: org}, nil
	case err != nil:
		return store.FSSBucketConfig{}, fssStoreUnavailable(err)
	}
	return c, nil
}

func fssStoreUnavailable(err error) error {
	return apierr.WithRetry(apierr.Newf(apierr.BackendUnavailable, "the snapshot bucket settings cannot be read or written now: %v", err), 5*time.Second)
}

// fssBucketConfigProto is c as the API shows it.
func (s *Server) fssBucketConfigProto(c store.FSSBucketConfig) *sandboxv1.FileSystemSnapshotBucketConfig {
	if c.Bucket == "" {
		return &sandboxv1.FileSystemSnapshotBucketConfig{
			Mode:                sandboxv1.FileSystemSnapshotBucketMode_FILE_SYSTEM_SNAPSHOT_BUCKET_MODE_CW_MANAGED,
			Region:              c.Region,
			EffectiveBucketName: s.fss.PlatformBucket,
		}
	}
	return &sandboxv1.FileSystemSnapshotBucketConfig{
		Mode:                sandboxv1.FileSystemSnapshotBucketMode_FILE_SYSTEM_SNAPSHOT_BUCKET_MODE_BRING_YOUR_OWN,
		BucketName:          c.Bucket,
		Region:              c.Region,
		EffectiveBucketName: c.Bucket,
	}
}

var s3RegionRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// fssBucketViolations checks an organization's own bucket and region: S3's bucket naming
// rules, not the platform's bucket, and no region without a bucket.
func fssBucketViolations(c store.FSSBucketConfig, platform string) []apierr.Violation {
	var vs []apierr.Violation
	if c.Bucket == "" {
		if c.Region != "" {
			vs = append(vs, apierr.Violation{Field: fssRegionField, Description: "needs a bucket_name (the platform's bucket has its own region)"})
		}
		return vs
	}
	if why := s3BucketNameProblem(c.Bucket); why != "" {
		vs = append(vs, apierr.Violation{Field: fssBucketField, Description: why})
	} else if c.Bucket == platform {
		vs = append(vs, apierr.Violation{Field: fssBucketField, Description: "is the platform's bucket: clear bucket_name to use it (CW_MANAGED)"})
	}
	if c.Region != "" && !s3RegionRE.MatchString(c.Region) {
		vs = append(vs, apierr.Violation{Field: fssRegionField, Description: "must be 1 to 64 of [a-z0-9-]"})
	}
	return vs
}

// s3BucketNameProblem says what breaks S3's bucket naming rules in name ("" if nothing).
func s3BucketNameProblem(name string) string { return s3.BucketNameProblem(name) }

// snapshotBucketFor is the bucket org's new snapshots go to (their object_bucket): its
// own bucket, or the platform's. The core calls it at CreateFileSystemSnapshot and for
// DeleteSandbox.snapshot_volumes.
func (s *Server) snapshotBucketFor(ctx context.Context, org string) (string, error) {
	c, err := s.fssBucketConfig(ctx, org)
	if err != nil {
		return "", err
	}
	if c.Bucket == "" {
		return s.fss.PlatformBucket, nil
	}
	return c.Bucket, nil
}

// checkRestoreBucket checks that a snapshot of org stored in objectBucket can be restored:
// one in the platform's bucket or in org's current bucket can; one in another bucket
// (org's own before it changed its config) cannot, even while that bucket is reachable:
// FAILED_PRECONDITION CWSANDBOX_FSS_BUCKET_MISMATCH, metadata object_bucket and
// current_bucket. That is the official client's SnapshotBucketMismatchError, "reversible
// by reverting the org's snapshot bucket configuration to the one the snapshot was
// written to": an organization that stops naming a bucket withdraws it from the
// platform, whose credentials may still reach it.
func (s *Server) checkRestoreBucket(ctx context.Context, org, objectBucket string) error {
	if objectBucket == "" || objectBucket == s.fss.PlatformBucket {
		return nil
	}
	current, err := s.snapshotBucketFor(ctx, org)
	if err != nil {
		return err
	}
	if objectBucket == current {
		return nil
	}
	return apierr.New(apierr.FSSBucketMismatch,
		fmt.Sprintf("the snapshot is in bucket %s, not the organization's snapshot bucket %s: set the snapshot bucket config back to %s to restore it", objectBucket, current, objectBucket),
		map[string]string{"object_bucket": objectBucket, "current_bucket": current})
}
