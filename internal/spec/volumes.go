package spec

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// MaxSnapshotIDBytes bounds restore_from_snapshot_id (snapshot IDs are much shorter).
const MaxSnapshotIDBytes = 128

// restoreRef is a scratch volume that starts from a snapshot.
type restoreRef struct {
	field      string // of its restore_from_snapshot_id
	sizeField  string // of its size
	volume     string
	snapshotID string
	sizeBytes  int64 // the volume's size; 0 = unsized
}

// scratchVolumes converts the spec's volumes, shared by its containers, and returns
// their names (which the containers' mounts must name) and the restores they ask for.
// Scratch volumes are supported; persistent volumes (volume_id) are reported as
// unsupported, and so are snapshot restores unless restores is set.
func scratchVolumes(spec *sandboxv1.SandboxSpec, restores, registered bool) ([]runtime.Volume, map[string]bool, []apierr.Violation, []string, []restoreRef) {
	var (
		vols        []runtime.Volume
		vs          []apierr.Violation
		unsupported []string
		refs        []restoreRef
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
		if id := v.GetVolumeId(); id != "" {
			switch {
			case !registered:
				unsupported = append(unsupported, "persistent volumes (volume_id)")
			case len(id) > MaxVolumeIDBytes || !volumeIDPattern.MatchString(id):
				add(vf+".volume_id", "must be a volume ID (a-z, 0-9, '-', '_', '.', at most %d), got %q", MaxVolumeIDBytes, id)
			default:
				// Managed is filled in by resolveRegistered once the spec is valid.
				vols = append(vols, runtime.Volume{Name: v.GetName()})
			}
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
		switch id := sc.GetRestoreFromSnapshotId(); {
		case id == "":
		case !restores:
			unsupported = append(unsupported, "volume snapshots")
		case len(id) > MaxSnapshotIDBytes:
			add(vf+".scratch.restore_from_snapshot_id", "is %d bytes, at most %d allowed", len(id), MaxSnapshotIDBytes)
		default:
			refs = append(refs, restoreRef{field: vf + ".scratch.restore_from_snapshot_id", sizeField: vf + ".scratch.size",
				volume: v.GetName(), snapshotID: id, sizeBytes: rv.SizeBytes})
		}
		vols = append(vols, rv)
	}
	return vols, names, vs, unsupported, refs
}

// MaxVolumeIDBytes bounds a registered volume's ID.
const MaxVolumeIDBytes = 63

// volumeIDPattern is what a registered volume's ID looks like (the caller chooses it).
var volumeIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)

// ValidVolumeID says whether id is a well-formed registered volume ID.
func ValidVolumeID(id string) bool {
	return len(id) <= MaxVolumeIDBytes && volumeIDPattern.MatchString(id)
}

// resolveRegistered fills in the registered volumes of out (converted from spec):
// each one's Managed name, and in every container's mounts of it the volume-level
// sub_path (before the mount's own) and read_only.
func resolveRegistered(spec *sandboxv1.SandboxSpec, req *runner.CreateRequest, resolve RegisteredResolver) error {
	out := &req.Spec
	regs := map[string]RegisteredVolume{}
	for i, v := range spec.GetVolumes() {
		if v.GetVolumeId() == "" {
			continue
		}
		rv, err := resolve(fmt.Sprintf("sandbox.spec.volumes[%d].volume_id", i), v.GetVolumeId())
		if err != nil {
			return err
		}
		regs[v.GetName()] = rv
		for j := range out.Volumes {
			if out.Volumes[j].Name != v.GetName() {
				continue
			}
			if rv.Global == nil {
				out.Volumes[j].Managed = rv.Managed
				continue
			}
			out.Volumes[j].Global, out.Volumes[j].SizeBytes = rv.Global, rv.SizeBytes
			if rv.Restore != nil {
				if req.Restores == nil {
					req.Restores = map[string]runner.SnapshotSource{}
				}
				req.Restores[v.GetName()] = *rv.Restore
			}
		}
	}
	if len(regs) == 0 {
		return nil
	}
	fix := func(ms []runtime.VolumeMount) {
		for k := range ms {
			rv, ok := regs[ms[k].Volume]
			if !ok {
				continue
			}
			if rv.SubPath != "" {
				ms[k].SubPath = strings.TrimSuffix(path.Join(rv.SubPath, ms[k].SubPath), "/")
			}
			ms[k].ReadOnly = ms[k].ReadOnly || rv.ReadOnly
		}
	}
	fix(out.Container.VolumeMounts)
	for i := range out.Sidecars {
		fix(out.Sidecars[i].VolumeMounts)
	}
	for i := range out.InitContainers {
		fix(out.InitContainers[i].VolumeMounts)
	}
	return nil
}

// Restorer looks up the snapshot a scratch volume restores: snapshotID as the caller gave
// it at field (sandbox.spec.volumes[i].scratch.restore_from_snapshot_id). It returns the
// snapshot, or the API error that refuses the create (CWSANDBOX_FSS_NOT_FOUND for one the
// caller may not see, CWSANDBOX_FSS_NOT_READY, …) naming field.
type Restorer func(field, snapshotID string) (runner.SnapshotSource, error)

// resolveRestores looks up every restore of refs with restore, in order, and checks that
// each snapshot fits its volume: a sized volume smaller than the snapshot's content is
// CWSANDBOX_FSS_SIZE_EXCEEDED. It returns the sources by volume name.
func resolveRestores(refs []restoreRef, restore Restorer) (map[string]runner.SnapshotSource, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	out := make(map[string]runner.SnapshotSource, len(refs))
	for _, r := range refs {
		src, err := restore(r.field, r.snapshotID)
		if err != nil {
			return nil, err
		}
		if r.sizeBytes > 0 && src.ContentBytes > r.sizeBytes {
			vs := []apierr.Violation{{Field: r.sizeField, Description: fmt.Sprintf(
				"volume %q is %d bytes, smaller than the %d bytes of files in snapshot %s; leave the size unset or make it at least that",
				r.volume, r.sizeBytes, src.ContentBytes, r.snapshotID)}}
			return nil, apierr.WithViolations(apierr.New(apierr.FSSSizeExceeded,
				"snapshot does not fit its volume: "+apierr.Describe(vs), map[string]string{"file_system_snapshot_id": r.snapshotID}), vs)
		}
		out[r.volume] = src
	}
	return out, nil
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
