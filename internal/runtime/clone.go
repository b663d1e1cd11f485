package runtime

import (
	"maps"
	"slices"
)

// Clone returns a deep copy of s: nothing of it is shared with s, but the contents of
// its files, which are never modified in place (they may add up to MaxFilesBytes, too much
// to copy for every snapshot a runner hands out). TestSpecClone fails on a field it
// shares.
func (s Spec) Clone() Spec {
	c := s
	if s.PullCredentials != nil {
		creds := *s.PullCredentials
		c.PullCredentials = &creds
	}
	c.Args = slices.Clone(s.Args)
	c.Env = maps.Clone(s.Env)
	c.Files = slices.Clone(s.Files)
	c.Volumes = slices.Clone(s.Volumes)
	c.VolumeMounts = slices.Clone(s.VolumeMounts)
	c.Security = s.Security.Clone()
	c.Services = slices.Clone(s.Services)
	c.Network = s.Network.Clone()
	c.Pod = s.Pod.Clone()
	c.Meta = maps.Clone(s.Meta)
	return c
}

// Clone returns a deep copy of s (nil for nil).
func (s *Security) Clone() *Security {
	if s == nil {
		return nil
	}
	c := *s
	c.RunAsUser = clonePtr(s.RunAsUser)
	c.RunAsGroup = clonePtr(s.RunAsGroup)
	c.CapAdd = slices.Clone(s.CapAdd)
	c.CapDrop = slices.Clone(s.CapDrop)
	return &c
}

// Clone returns a deep copy of n (nil for nil).
func (n *Network) Clone() *Network {
	if n == nil {
		return nil
	}
	c := *n
	c.Egress = slices.Clone(n.Egress)
	for i := range c.Egress {
		c.Egress[i].Except = slices.Clone(c.Egress[i].Except)
		c.Egress[i].Ports = slices.Clone(c.Egress[i].Ports)
	}
	c.Ingress = slices.Clone(n.Ingress)
	for i := range c.Ingress {
		c.Ingress[i].Except = slices.Clone(c.Ingress[i].Except)
		c.Ingress[i].Ports = slices.Clone(c.Ingress[i].Ports)
	}
	return &c
}

// Clone returns a deep copy of p (nil for nil).
func (p *PodSettings) Clone() *PodSettings {
	if p == nil {
		return nil
	}
	c := *p
	c.NodeSelector = maps.Clone(p.NodeSelector)
	c.Tolerations = slices.Clone(p.Tolerations)
	for i := range c.Tolerations {
		c.Tolerations[i].TolerationSeconds = clonePtr(c.Tolerations[i].TolerationSeconds)
	}
	c.ImagePullSecrets = slices.Clone(p.ImagePullSecrets)
	c.Annotations = maps.Clone(p.Annotations)
	return &c
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
