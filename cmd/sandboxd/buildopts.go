package main

import (
	"errors"
	"flag"
	"time"

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
func buildOptions(st store.Store, reg *registry.Registry, host string, f buildFlags) gateway.BuildOptions {
	o := gateway.BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs(), Retention: f.retention, Keep: f.keep}
	if reg != nil {
		o.RegistryHost, o.MintPushToken, o.MintPullToken, o.PushInsecure = host, reg.MintPushToken, reg.MintPullToken, true
	}
	return o
}

// buildFlags are the gateway's build retention flags (`dev`, `gateway`).
type buildFlags struct {
	retention time.Duration
	keep      int
}

func (b *buildFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&b.retention, "build-retention", gateway.DefaultBuildRetention, "ended image builds (and their logs) older than this are deleted (0: kept forever)")
	fs.IntVar(&b.keep, "build-keep", gateway.DefaultBuildKeep, "ended image builds kept per organization, the oldest beyond deleted with their logs (0: no bound)")
}

func (b buildFlags) validate() error {
	if b.retention < 0 {
		return errors.New("--build-retention must not be negative (0 keeps builds forever)")
	}
	if b.retention > 0 && b.retention < time.Hour {
		return errors.New("--build-retention must be at least 1h (or 0: forever)")
	}
	if b.keep < 0 {
		return errors.New("--build-keep must not be negative (0: no bound)")
	}
	return nil
}
