package gateway

import "github.com/sandboxd/sandboxd/internal/runtime"

// registryCredsFunc mints pull credentials for org for an image of the platform
// registry (ok false for any other image): Config.RegistryCredentials.
type registryCredsFunc func(org, image string) (username, password string, ok bool)

// addRegistryCredentials gives each container of sp whose image is in the platform
// registry, and that brings no credentials of its own, pull credentials minted for org
// (pull-only, short-lived: Config.RegistryCredentials). They travel to the runner with
// this create only: the runtime never persists PullCredentials.
func (s *Server) addRegistryCredentials(sp *runtime.Spec, org string) {
	addRegistryCredentials(s.registryCreds, sp, org)
}

// addRegistryCredentials is Server.addRegistryCredentials with mint as the minter (nil:
// none). Warm targets get theirs this way too (warmDesired): registry.DefaultPullTokenTTL
// (15 min) outlives the targets' resend cycle (DefaultWarmInterval, 30 s) many times over,
// so a runner always holds valid ones for its refills while the gateway is up.
func addRegistryCredentials(mint registryCredsFunc, sp *runtime.Spec, org string) {
	if mint == nil {
		return
	}
	add := func(c *runtime.Container) {
		if c.PullCredentials != nil || c.Image == "" {
			return
		}
		if u, p, ok := mint(org, c.Image); ok {
			c.PullCredentials = &runtime.Credentials{Username: u, Password: p}
		}
	}
	if e := sp.Engine; e != nil {
		for _, img := range e.Images {
			if e.PullCredentials[img] != nil {
				continue
			}
			if u, p, ok := mint(org, img); ok {
				if e.PullCredentials == nil {
					e.PullCredentials = map[string]*runtime.Credentials{}
				}
				e.PullCredentials[img] = &runtime.Credentials{Username: u, Password: p}
			}
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
