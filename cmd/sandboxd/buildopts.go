package main

import (
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

// buildOptions configures the gateway's image builds (BuildService) on st, pushing to
// reg at host (nil: StartBuild answers CWSANDBOX_BUILD_NOT_SUPPORTED). The registry is
// served at the API port, which is plain HTTP (h2c) in every mode (`dev` and `gateway`),
// so runners push to it insecurely — HTTPS preferred, plain HTTP accepted — whether they
// run in-process or behind the runner wire (runner.v1 BuildRequest.push_insecure); a TLS
// front named by --registry-host is still reached over HTTPS.
func buildOptions(st store.Store, reg *registry.Registry, host string) gateway.BuildOptions {
	o := gateway.BuildOptions{Store: st.Builds()}
	if reg != nil {
		o.RegistryHost, o.MintPushToken, o.MintPullToken, o.PushInsecure = host, reg.MintPushToken, reg.MintPullToken, true
	}
	return o
}
