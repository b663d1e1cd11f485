package main

import (
	"context"
	"errors"
	"flag"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob/s3"
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
//
// --build-storage-endpoints is parsed here, where the result is used: the flags' validate
// runs on a copy (value receivers), so what it parsed would be lost.
func buildOptions(st store.Store, reg *registry.Registry, host string, f buildFlags) (gateway.BuildOptions, error) {
	eps, err := f.storageEndpoints()
	if err != nil {
		return gateway.BuildOptions{}, err
	}
	o := gateway.BuildOptions{Store: st.Builds(), Settings: st.BuildStorageConfigs(), Retention: f.retention, Keep: f.keep, StorageEndpoints: eps}
	if reg != nil {
		o.RegistryHost, o.MintPushToken, o.MintPullToken, o.PushInsecure = host, reg.MintPushToken, reg.MintPullToken, true
		o.OnStorageChange = reg.ForgetOrgStorage
	}
	return o, nil
}

// orgStorageRef is the registry's Config.OrgStorage before the gateway that answers it
// exists (the registry is opened first).
type orgStorageRef struct {
	gw atomic.Pointer[gateway.Server]
}

func (r *orgStorageRef) get(ctx context.Context, org string) (*s3.Config, error) {
	gw := r.gw.Load()
	if gw == nil {
		return nil, errors.New("the gateway is not started yet")
	}
	return gw.OrgBuildStorage(ctx, org)
}

// buildFlags are the gateway's build retention flags (`dev`, `gateway`).
type buildFlags struct {
	retention time.Duration
	keep      int
	// endpointsFlag is --build-storage-endpoints (storageEndpoints parses it).
	endpointsFlag string
}

func (b *buildFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&b.retention, "build-retention", gateway.DefaultBuildRetention, "ended image builds (and their logs) older than this are deleted (0: kept forever)")
	fs.IntVar(&b.keep, "build-keep", gateway.DefaultBuildKeep, "ended image builds kept per organization, the oldest beyond deleted with their logs (0: no bound)")
	fs.StringVar(&b.endpointsFlag, "build-storage-endpoints", "", "S3 endpoints organizations may keep their own build storage at (build storage mode CUSTOMER_OWNED; its location names one): comma-separated [http://|https://]host[:port][=region], https by default; empty: CUSTOMER_OWNED is refused")
}

// storageEndpoints are the endpoints --build-storage-endpoints allows.
func (b buildFlags) storageEndpoints() ([]gateway.BuildStorageEndpoint, error) {
	eps, err := gateway.ParseBuildStorageEndpoints(b.endpointsFlag)
	if err != nil {
		return nil, err // it names the flag
	}
	return eps, nil
}

// validate checks the flags; it keeps nothing (it may run on a copy).
func (b buildFlags) validate() error {
	if _, err := b.storageEndpoints(); err != nil {
		return err
	}
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
