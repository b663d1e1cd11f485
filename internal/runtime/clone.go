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
	c.Container = s.Container.Clone()
	c.Sidecars = cloneContainers(s.Sidecars)
	c.InitContainers = cloneContainers(s.InitContainers)
	c.HostAliases = slices.Clone(s.HostAliases)
	c.Volumes = slices.Clone(s.Volumes)
	for i := range c.Volumes {
		if g := c.Volumes[i].Global; g != nil {
			cg := *g
			c.Volumes[i].Global = &cg
		}
	}
	c.Services = slices.Clone(s.Services)
	c.Network = s.Network.Clone()
	c.Pod = s.Pod.Clone()
	c.Engine = s.Engine.Clone()
	c.Meta = maps.Clone(s.Meta)
	c.EgressSecretValues = maps.Clone(s.EgressSecretValues)
	return c
}

// Clone returns a deep copy of c but for its files' contents (see Spec.Clone).
func (c Container) Clone() Container {
	out := c
	if c.PullCredentials != nil {
		creds := *c.PullCredentials
		out.PullCredentials = &creds
	}
	out.Args = slices.Clone(c.Args)
	out.Env = maps.Clone(c.Env)
	out.SecretEnv = maps.Clone(c.SecretEnv)
	out.SecretRefs = slices.Clone(c.SecretRefs)
	out.Files = slices.Clone(c.Files)
	out.VolumeMounts = slices.Clone(c.VolumeMounts)
	out.Tmpfs = slices.Clone(c.Tmpfs)
	out.Security = c.Security.Clone()
	if c.StartupProbe != nil {
		p := *c.StartupProbe
		p.Exec = slices.Clone(p.Exec)
		out.StartupProbe = &p
	}
	out.DependsOn = slices.Clone(c.DependsOn)
	return out
}

func cloneContainers(cs []Container) []Container {
	if cs == nil {
		return nil
	}
	out := make([]Container, len(cs))
	for i := range cs {
		out[i] = cs[i].Clone()
	}
	return out
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
		if sec := c.Egress[i].Secret; sec != nil {
			cs := *sec
			c.Egress[i].Secret = &cs
		}
	}
	c.Ingress = slices.Clone(n.Ingress)
	for i := range c.Ingress {
		c.Ingress[i].Except = slices.Clone(c.Ingress[i].Except)
		c.Ingress[i].Ports = slices.Clone(c.Ingress[i].Ports)
	}
	return &c
}

// Clone returns a deep copy of e (nil for nil).
func (e *Engine) Clone() *Engine {
	if e == nil {
		return nil
	}
	c := *e
	c.Compose = slices.Clone(e.Compose)
	c.Images = slices.Clone(e.Images)
	if e.PullCredentials != nil {
		c.PullCredentials = make(map[string]*Credentials, len(e.PullCredentials))
		for k, v := range e.PullCredentials {
			if v != nil {
				cr := *v
				v = &cr
			}
			c.PullCredentials[k] = v
		}
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
