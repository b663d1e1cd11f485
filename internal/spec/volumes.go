package spec

import (
	"fmt"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// scratchVolumes converts the spec's volumes, shared by its containers, and returns
// their names (which the containers' mounts must name). Scratch volumes are supported;
// persistent volumes (volume_id) and snapshot restores are reported as unsupported.
func scratchVolumes(spec *sandboxv1.SandboxSpec) ([]runtime.Volume, map[string]bool, []apierr.Violation, []string) {
	var (
		vols        []runtime.Volume
		vs          []apierr.Violation
		unsupported []string
	)
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	names := map[string]bool{}
	for i, v := range spec.GetVolumes() {
		vf := fmt.Sprintf("sandbox.spec.volumes[%d]", i)
		switch {
		case !dnsLabel.MatchString(v.GetName()):
			add(vf+".name", "must be a lowercase DNS label (a-z, 0-9, '-', at most 63), got %q", v.GetName())
		case names[v.GetName()]:
			add(vf+".name", "%q is declared twice", v.GetName())
		}
		names[v.GetName()] = true
		if v.GetVolumeId() != "" {
			unsupported = append(unsupported, "persistent volumes (volume_id)")
			continue
		}
		rv := runtime.Volume{Name: v.GetName()}
		sc := v.GetScratch() // nil: a default scratch volume
		if s := sc.GetSize(); s != "" {
			n, err := quantity.ParseMemory(s)
			if err != nil || n <= 0 {
				add(vf+".scratch.size", "want a positive size such as 1Gi, got %q", s)
			}
			rv.SizeBytes = n
		}
		switch sc.GetMedium() {
		case sandboxv1.StorageMedium_STORAGE_MEDIUM_UNSPECIFIED, sandboxv1.StorageMedium_STORAGE_MEDIUM_DISK:
		case sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY:
			rv.Medium = runtime.MediumMemory
		default:
			add(vf+".scratch.medium", "unknown medium %v", sc.GetMedium())
		}
		if sc.GetRestoreFromSnapshotId() != "" {
			unsupported = append(unsupported, "volume snapshots")
		}
		vols = append(vols, rv)
	}
	return vols, names, vs, unsupported
}

// volumeMounts converts container c's (field f) volume mounts of the volumes names,
// appending problems to vs: each container mounts the shared volumes where it likes.
func volumeMounts(c *sandboxv1.Container, f string, names map[string]bool, vs []apierr.Violation) ([]runtime.VolumeMount, []apierr.Violation) {
	var mounts []runtime.VolumeMount
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	paths := map[string]bool{}
	for j, m := range c.GetVolumeMounts() {
		mf := fmt.Sprintf("%s.volume_mounts[%d]", f, j)
		if !names[m.GetVolume()] {
			add(mf+".volume", "no volume named %q in sandbox.spec.volumes", m.GetVolume())
		}
		if err := runtime.CheckMountPath(m.GetMountPath()); err != nil {
			add(mf+".mount_path", "%v", err)
		} else if paths[m.GetMountPath()] {
			add(mf+".mount_path", "%s is mounted twice", m.GetMountPath())
		}
		paths[m.GetMountPath()] = true
		if err := runtime.CheckSubPath(m.GetSubPath()); err != nil {
			add(mf+".sub_path", "%v", err)
		}
		mounts = append(mounts, runtime.VolumeMount{Volume: m.GetVolume(), Path: m.GetMountPath(), ReadOnly: m.GetReadOnly(),
			SubPath: strings.TrimSuffix(m.GetSubPath(), "/")})
	}
	return mounts, vs
}
