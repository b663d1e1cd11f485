package gateway

import "github.com/sandboxd/sandboxd/internal/runtime"

// addRegistryCredentials gives each container of sp whose image is in the platform
// registry, and that brings no credentials of its own, pull credentials minted for org
// (pull-only, short-lived: Config.RegistryCredentials). They travel to the runner with
// this create only: the runtime never persists PullCredentials.
func (s *Server) addRegistryCredentials(sp *runtime.Spec, org string) {
	if s.registryCreds == nil {
		return
	}
	add := func(c *runtime.Container) {
		if c.PullCredentials != nil || c.Image == "" {
			return
		}
		if u, p, ok := s.registryCreds(org, c.Image); ok {
			c.PullCredentials = &runtime.Credentials{Username: u, Password: p}
		}
	}
	add(&sp.Container)
	for i := range sp.Sidecars {
		add(&sp.Sidecars[i])
	}
	for i := range sp.InitContainers {
		add(&sp.InitContainers[i])
	}
}
