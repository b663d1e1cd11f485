package policy

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/sandboxd/sandboxd/internal/quantity"
)

// VolumeConstraints bound registered volumes held as claims (Kubernetes runners'
// PersistentVolumeClaims, docs/volumes.md).
type VolumeConstraints struct {
	// AllowedStorageClasses lists the storage classes a claim the runner makes or adopts
	// may have. Absent: any; [] allows none (no registered volumes on the runner).
	AllowedStorageClasses []string `json:"allowed_storage_classes,omitzero"`
	// MaxSize bounds the size of each registered volume made or grown on the runner
	// (VolumeSpec.size), a memory quantity ("50Gi"); absent: the gateway's bounds only
	// (16Mi to 1Ti). Volumes already larger keep their size.
	MaxSize Quantity `json:"max_size,omitempty"`
}

// ConstraintVolumeMaxSize: a registered volume is larger than the runner's policy allows.
const ConstraintVolumeMaxSize = "constraints.volumes.max_size"

// VolumeMaxSize is the largest registered volume the policy allows on its runner, in
// bytes; 0: no bound. A policy that does not validate has none.
func (p *Policy) VolumeMaxSize() int64 {
	if p == nil || p.Constraints.Volumes == nil || p.Constraints.Volumes.MaxSize == "" {
		return 0
	}
	n, err := quantity.ParseMemory(string(p.Constraints.Volumes.MaxSize))
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// storageClassName is a StorageClass name: a DNS-1123 subdomain.
var storageClassName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

const maxStorageClassName = 253

func validStorageClass(s string) bool {
	return len(s) <= maxStorageClassName && storageClassName.MatchString(s)
}

// validateVolumes checks base.volume_storage_class and constraints.volumes.
func validateVolumes(p *Policy, add func(field, format string, args ...any)) {
	if s := p.Base.VolumeStorageClass; s != "" && !validStorageClass(s) {
		add("policy.base.volume_storage_class", "%q is not a storage class name (a DNS-1123 subdomain of at most %d characters)", s, maxStorageClassName)
	}
	vc := p.Constraints.Volumes
	if vc == nil {
		return
	}
	if q := vc.MaxSize; q != "" {
		if n, err := quantity.ParseMemory(string(q)); err != nil {
			add("policy.constraints.volumes.max_size", "%v", err)
		} else if n <= 0 {
			add("policy.constraints.volumes.max_size", "must be positive, got %q", q)
		}
	}
	for i, s := range vc.AllowedStorageClasses {
		if !validStorageClass(s) {
			add(fmt.Sprintf("policy.constraints.volumes.allowed_storage_classes[%d]", i), "%q is not a storage class name (a DNS-1123 subdomain of at most %d characters)", s, maxStorageClassName)
		}
	}
	if s := p.Base.VolumeStorageClass; s != "" && vc.AllowedStorageClasses != nil && !slices.Contains(vc.AllowedStorageClasses, s) {
		add("policy.base.volume_storage_class", "%q is not in constraints.volumes.allowed_storage_classes", s)
	}
}

// VolumeStorageClasses are the class of the claims a runner makes for registered volumes
// ("": the cluster's default class) and the classes claims may have (nil: any).
func (p *Policy) VolumeStorageClasses() (class string, allowed []string) {
	if p == nil {
		return "", nil
	}
	if vc := p.Constraints.Volumes; vc != nil && vc.AllowedStorageClasses != nil {
		allowed = slices.Clone(vc.AllowedStorageClasses)
	}
	return p.Base.VolumeStorageClass, allowed
}
