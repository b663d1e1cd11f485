package policy

import (
	"fmt"
	"regexp"
	"slices"
)

// VolumeConstraints bound registered volumes held as claims (Kubernetes runners'
// PersistentVolumeClaims, docs/volumes.md).
type VolumeConstraints struct {
	// AllowedStorageClasses lists the storage classes a claim the runner makes or adopts
	// may have. Absent: any; [] allows none (no registered volumes on the runner).
	AllowedStorageClasses []string `json:"allowed_storage_classes,omitzero"`
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
