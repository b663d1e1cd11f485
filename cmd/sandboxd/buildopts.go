package main

import (
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

// buildOptions configures the gateway's image builds (BuildService) on st, pushing to
// reg at host (nil: StartBuild answers CWSANDBOX_BUILD_NOT_SUPPORTED); insecure: the
// registry speaks plain HTTP to in-process runners.
func buildOptions(st store.Store, reg *registry.Registry, host string, insecure bool) gateway.BuildOptions {
	o := gateway.BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs()}
	if reg != nil {
		o.RegistryHost, o.MintPushToken, o.MintPullToken, o.PushInsecure = host, reg.MintPushToken, reg.MintPullToken, insecure
	}
	return o
}
