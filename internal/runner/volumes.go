package runner

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Registered volumes (VolumeService; docs/volumes.md): a CLUSTER_LOCAL volume lives on
// one runner, whose backend holds it (runtime.ManagedVolumes). The gateway asks the
// runner to make and check it (EnsureVolume) and to remove it (DeleteVolume); a sandbox
// mounts it through a runtime.Volume whose Managed is ManagedName.

// RegisteredVolume names a registered volume of an organization on a runner.
type RegisteredVolume struct {
	Org       string
	ClaimName string
	Namespace string
	SizeBytes int64 // 0: the backend's default
	// StorageClass and AllowedStorageClasses come from the runner's policy
	// (base.volume_storage_class, constraints.volumes.allowed_storage_classes; the
	// runnerapi server fills them): for backends whose volumes are claims
	// (runtime.ClaimVolumes). AllowedStorageClasses nil: any class.
	StorageClass          string
	AllowedStorageClasses []string
	// MaxSizeBytes is the largest volume the runner's policy allows
	// (constraints.volumes.max_size; the runnerapi server fills it, never the caller);
	// 0: no policy bound (MaxRegisteredVolumeBytes still holds). A volume the backend
	// already holds at SizeBytes or more keeps its size (it only cannot grow).
	MaxSizeBytes int64
}

// MaxRegisteredVolumeBytes bounds a registered volume's size on every runner, whatever
// the caller of the runner API says (the gateway bounds spec.size the same: 1 TiB).
const MaxRegisteredVolumeBytes int64 = 1 << 40

// VolumeHandle is implemented by Handles whose runner holds registered volumes (Local,
// runnerapi.Client).
type VolumeHandle interface {
	// EnsureVolume makes v when missing, checks it and returns its capacity and access
	// modes.
	EnsureVolume(ctx context.Context, v RegisteredVolume) (VolumeState, error)
	// DeleteVolume removes v and its content; a missing one is no error. Without force,
	// a volume live sandboxes of the runner mount is refused (CWSANDBOX_VOLUME_IN_USE).
	DeleteVolume(ctx context.Context, v RegisteredVolume, force bool) error
}

// VolumeState is what EnsureVolume found of a registered volume.
type VolumeState struct {
	CapacityBytes int64
	// AccessModes are the Kubernetes access modes of a claim (runtime.ClaimState); nil on
	// backends whose volumes any number of the runner's sandboxes mount read-write
	// (ReadWriteMany: the local backend).
	AccessModes []string
}

// ClaimNamePattern is what a registered volume's claim_name looks like (a DNS-1123 label).
var ClaimNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// VolumeNamespace is the one namespace a local runner's registered volumes are in.
const VolumeNamespace = "default"

// ManagedName is the backend name of v (runtime.ManagedVolumeName).
func (v RegisteredVolume) ManagedName() string { return runtime.ManagedVolumeName(v.Org, v.ClaimName) }

func (v RegisteredVolume) check() error {
	switch {
	case v.Org == "":
		return apierr.Newf(apierr.InvalidRequest, "registered volume: organization_id is required")
	case !ClaimNamePattern.MatchString(v.ClaimName):
		return apierr.Newf(apierr.InvalidRequest, "registered volume: claim_name %q must be a DNS-1123 label (a-z, 0-9, '-', at most 63)", v.ClaimName)
	case v.SizeBytes < 0:
		return apierr.Newf(apierr.InvalidRequest, "registered volume: negative size")
	case v.SizeBytes > MaxRegisteredVolumeBytes:
		vs := []apierr.Violation{{Field: "volume.spec.size", Description: fmt.Sprintf("%d bytes is above %d, the largest volume a runner makes", v.SizeBytes, MaxRegisteredVolumeBytes)}}
		return apierr.Invalid(apierr.InvalidRequest, fmt.Sprintf("registered volume %s: %s", v.ClaimName, apierr.Describe(vs)), vs)
	}
	return nil
}

// checkPolicySize refuses v when it is larger than the runner's policy allows
// (v.MaxSizeBytes) and the backend does not already hold it that large (held: its size
// now, 0 when missing or unknown).
func (v RegisteredVolume) checkPolicySize(held int64) error {
	if v.MaxSizeBytes <= 0 || v.SizeBytes <= v.MaxSizeBytes || (held > 0 && v.SizeBytes <= held) {
		return nil
	}
	vs := []apierr.Violation{{Field: "volume.spec.size", Description: fmt.Sprintf("%d bytes is above %d, the largest volume this runner's policy allows (%s)",
		v.SizeBytes, v.MaxSizeBytes, policy.ConstraintVolumeMaxSize)}}
	return apierr.Invalid(apierr.PlacementRejected, fmt.Sprintf("registered volume %s: %s", v.ClaimName, apierr.Describe(vs)), vs)
}

// VolumeNamespace is the namespace of the runner's registered volumes: its backend's claim
// namespace (Kubernetes), else VolumeNamespace.
func (r *Runner) VolumeNamespace() string {
	if cv, ok := r.backend.(runtime.ClaimVolumes); ok {
		return cv.ClaimNamespace()
	}
	return VolumeNamespace
}

// checkNamespace refuses a volume outside ns, the runner's one namespace.
func (v RegisteredVolume) checkNamespace(ns string) error {
	if v.Namespace == ns {
		return nil
	}
	return apierr.WithViolations(apierr.Newf(apierr.VolumeRunnerIneligible, "registered volume: namespace %q: volumes of this runner are in namespace %q", v.Namespace, ns),
		[]apierr.Violation{{Field: "volume.spec.pvc.namespace", Description: fmt.Sprintf("must be %q, the runner's namespace", ns)}})
}

func (v RegisteredVolume) claim() runtime.Claim {
	return runtime.Claim{Org: v.Org, Name: v.ClaimName, Managed: v.ManagedName(), SizeBytes: v.SizeBytes,
		StorageClass: v.StorageClass, AllowedStorageClasses: v.AllowedStorageClasses}
}

// claimErr maps a ClaimVolumes error to the API's.
func claimErr(v RegisteredVolume, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runtime.ErrClaimIneligible):
		return apierr.WithViolations(apierr.Newf(apierr.VolumeRunnerIneligible, "registered volume %s: %v", v.ClaimName, err),
			[]apierr.Violation{{Field: "volume.spec.pvc.claim_name", Description: err.Error()}})
	case errors.Is(err, runtime.ErrInvalidSpec):
		return apierr.Newf(apierr.InvalidRequest, "registered volume %s: %v", v.ClaimName, err)
	}
	return fmt.Errorf("registered volume %s: %w", v.ClaimName, err)
}

func (r *Runner) managedVolumes() (runtime.ManagedVolumes, error) {
	mv, ok := r.backend.(runtime.ManagedVolumes)
	if !ok {
		return nil, apierr.Newf(apierr.VolumeTypeNotSupported, "this runner's backend holds no registered volumes")
	}
	if why := mv.ManagedUnavailable(); why != "" {
		return nil, apierr.Newf(apierr.VolumeTypeNotSupported, "this runner holds no registered volumes: %s", why)
	}
	return mv, nil
}

// EnsureVolume implements VolumeHandle.
func (r *Runner) EnsureVolume(ctx context.Context, v RegisteredVolume) (VolumeState, error) {
	if err := v.check(); err != nil {
		return VolumeState{}, err
	}
	if cv, ok := r.backend.(runtime.ClaimVolumes); ok {
		if err := v.checkNamespace(cv.ClaimNamespace()); err != nil {
			return VolumeState{}, err
		}
		if v.MaxSizeBytes > 0 && v.SizeBytes > v.MaxSizeBytes {
			var held int64
			if cz, ok := cv.(runtime.ClaimSizer); ok {
				var err error
				if held, err = cz.ClaimSize(ctx, v.claim()); err != nil {
					r.log.Warn("registered volume: claim size now", "org", v.Org, "claim", v.ClaimName, "err", err)
					held = 0
				}
			}
			if err := v.checkPolicySize(held); err != nil {
				return VolumeState{}, err
			}
		}
		cs, err := cv.EnsureClaim(ctx, v.claim())
		if err != nil {
			return VolumeState{}, claimErr(v, err)
		}
		return VolumeState{CapacityBytes: cs.CapacityBytes, AccessModes: cs.AccessModes}, nil
	}
	if err := v.checkNamespace(VolumeNamespace); err != nil {
		return VolumeState{}, err
	}
	mv, err := r.managedVolumes()
	if err != nil {
		return VolumeState{}, err
	}
	if v.MaxSizeBytes > 0 && v.SizeBytes > v.MaxSizeBytes {
		var held int64
		if ms, ok := mv.(runtime.ManagedSizer); ok {
			if held, err = ms.ManagedSize(v.ManagedName()); err != nil {
				r.log.Warn("registered volume: size now", "org", v.Org, "claim", v.ClaimName, "err", err)
				held = 0
			}
		}
		if err := v.checkPolicySize(held); err != nil {
			return VolumeState{}, err
		}
	}
	n, err := mv.EnsureManaged(v.ManagedName(), v.SizeBytes)
	if errors.Is(err, runtime.ErrInvalidSpec) {
		return VolumeState{}, apierr.Newf(apierr.InvalidRequest, "registered volume %s: %v", v.ClaimName, err)
	}
	if errors.Is(err, runtime.ErrManagedBusy) {
		return VolumeState{}, apierr.New(apierr.VolumeInUse, fmt.Sprintf("registered volume %s: %v", v.ClaimName, err), nil)
	}
	if err != nil {
		// The backend's error names host paths and tools (mkfs, e2fsck, resize2fs): it
		// stays in the runner's log; the caller learns what failed, not where.
		r.log.Warn("registered volume", "org", v.Org, "claim", v.ClaimName, "err", err)
		why := "see the runner's log"
		if errors.Is(err, syscall.ENOSPC) {
			why = "the runner's disk is full"
		}
		return VolumeState{}, fmt.Errorf("registered volume %s: the runner could not make, check or grow it (%s)", v.ClaimName, why)
	}
	return VolumeState{CapacityBytes: n}, nil
}

// DeleteVolume implements VolumeHandle.
func (r *Runner) DeleteVolume(ctx context.Context, v RegisteredVolume, force bool) error {
	if err := v.check(); err != nil {
		return err
	}
	cv, isClaim := r.backend.(runtime.ClaimVolumes)
	var mv runtime.ManagedVolumes
	if isClaim {
		if err := v.checkNamespace(cv.ClaimNamespace()); err != nil {
			return err
		}
	} else {
		if err := v.checkNamespace(VolumeNamespace); err != nil {
			return err
		}
		var err error
		if mv, err = r.managedVolumes(); err != nil {
			return err
		}
	}
	name := v.ManagedName()
	if !force {
		var users []string
		for _, sb := range r.List() {
			if sb.State.Terminal() {
				continue
			}
			for _, vol := range sb.Spec.Volumes {
				if vol.Managed == name {
					users = append(users, sb.ID)
					break
				}
			}
		}
		if len(users) > 0 {
			return apierr.New(apierr.VolumeInUse, fmt.Sprintf("registered volume %s is mounted by live sandboxes: %s", v.ClaimName, strings.Join(users, ", ")),
				map[string]string{"sandbox_ids": strings.Join(users, ",")})
		}
	}
	if isClaim {
		return claimErr(v, cv.RemoveClaim(ctx, v.claim()))
	}
	return mv.RemoveManaged(name)
}
