package runnerapi

import (
	"slices"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func securityToProto(s *runtime.Security) *runnerv1.Security {
	if s == nil {
		return nil
	}
	return &runnerv1.Security{
		RunAsUser: s.RunAsUser, RunAsGroup: s.RunAsGroup, ReadOnlyRootFs: s.ReadOnlyRootFS,
		CapAdd: slices.Clone(s.CapAdd), CapDrop: slices.Clone(s.CapDrop),
		AllowPrivilegeEscalation: s.AllowPrivilegeEscalation, SeccompProfile: s.SeccompProfile,
		Privileged: s.Privileged,
	}
}

func securityFromProto(p *runnerv1.Security) *runtime.Security {
	if p == nil {
		return nil
	}
	return &runtime.Security{
		RunAsUser: p.RunAsUser, RunAsGroup: p.RunAsGroup, ReadOnlyRootFS: p.GetReadOnlyRootFs(),
		CapAdd: slices.Clone(p.GetCapAdd()), CapDrop: slices.Clone(p.GetCapDrop()),
		AllowPrivilegeEscalation: p.GetAllowPrivilegeEscalation(), SeccompProfile: p.GetSeccompProfile(),
		Privileged: p.GetPrivileged(),
	}
}

func volumesToProto(vs []runtime.Volume, ms []runtime.VolumeMount) ([]*runnerv1.Volume, []*runnerv1.VolumeMount) {
	var pv []*runnerv1.Volume
	for _, v := range vs {
		pvol := &runnerv1.Volume{Name: v.Name, SizeBytes: v.SizeBytes, Medium: v.Medium, Managed: v.Managed}
		if g := v.Global; g != nil {
			pvol.Global = &runnerv1.GlobalVolume{BlobPrefix: g.BlobPrefix, CommitGeneration: g.CommitGeneration, MaxSizeBytes: g.MaxSizeBytes}
		}
		pv = append(pv, pvol)
	}
	var pm []*runnerv1.VolumeMount
	for _, m := range ms {
		pm = append(pm, &runnerv1.VolumeMount{Volume: m.Volume, Path: m.Path, ReadOnly: m.ReadOnly, SubPath: m.SubPath})
	}
	return pv, pm
}

func volumesFromProto(pv []*runnerv1.Volume, pm []*runnerv1.VolumeMount) ([]runtime.Volume, []runtime.VolumeMount) {
	var vs []runtime.Volume
	for _, v := range pv {
		rv := runtime.Volume{Name: v.GetName(), SizeBytes: v.GetSizeBytes(), Medium: v.GetMedium(), Managed: v.GetManaged()}
		if g := v.GetGlobal(); g != nil {
			rv.Global = &runtime.GlobalVolume{BlobPrefix: g.GetBlobPrefix(), CommitGeneration: g.GetCommitGeneration(), MaxSizeBytes: g.GetMaxSizeBytes()}
		}
		vs = append(vs, rv)
	}
	var ms []runtime.VolumeMount
	for _, m := range pm {
		ms = append(ms, runtime.VolumeMount{Volume: m.GetVolume(), Path: m.GetPath(), ReadOnly: m.GetReadOnly(), SubPath: m.GetSubPath()})
	}
	return vs, ms
}
