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
// reg at host (nil: StartBuild answers CWSANDBOX_BUILD_NOT_SUPPORTED); insecure: the
// registry speaks plain HTTP to in-process runners.
func buildOptions(st store.Store, reg *registry.Registry, host string, insecure bool, f buildFlags) gateway.BuildOptions {
	o := gateway.BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs(), Retention: f.retention, Keep: f.keep}
	if reg != nil {
		o.RegistryHost, o.MintPushToken, o.MintPullToken, o.PushInsecure = host, reg.MintPushToken, reg.MintPullToken, insecure
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
