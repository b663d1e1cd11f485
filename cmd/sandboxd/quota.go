package main

import (
	"flag"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/store"
)

// quotaFlags are the default per-organization quotas of organizations whose quota
// leaves a limit unset (`sandboxd gateway` and `sandboxd dev`; `sbx admin quota set`
// sets an organization's own). 0 (the default) is unlimited.
type quotaFlags struct {
	maxSandboxes                   int64
	maxCPU, maxMemory, maxVolBytes string
}

func (f *quotaFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&f.maxSandboxes, "default-max-sandboxes", 0, "sandboxes an organization without its own quota runs at once (0: unlimited)")
	fs.StringVar(&f.maxCPU, "default-max-cpu", "0", "CPU (e.g. 8 or 8000m) the live sandboxes of an organization without its own quota hold in all (0: unlimited)")
	fs.StringVar(&f.maxMemory, "default-max-memory", "0", "memory (e.g. 32Gi) the live sandboxes of an organization without its own quota hold in all (0: unlimited)")
	fs.StringVar(&f.maxVolBytes, "default-max-volume-bytes", "0", "sizes (e.g. 1Ti) of the registered volumes of an organization without its own quota, in all (0: unlimited)")
}

// options are the gateway's QuotaOptions of the flags over st (nil: validation only);
// the platform organization's admins set quotas.
func (f quotaFlags) options(st store.Store, platformOrg string) (gateway.QuotaOptions, error) {
	if f.maxSandboxes < 0 {
		return gateway.QuotaOptions{}, fmt.Errorf("--default-max-sandboxes %d: 0 (unlimited) or more", f.maxSandboxes)
	}
	cpu, err := quantity.ParseCPU(f.maxCPU)
	if err != nil || cpu < 0 {
		return gateway.QuotaOptions{}, fmt.Errorf("--default-max-cpu %q: a CPU quantity (0: unlimited)", f.maxCPU)
	}
	mem, err := quantity.ParseMemory(f.maxMemory)
	if err != nil || mem < 0 {
		return gateway.QuotaOptions{}, fmt.Errorf("--default-max-memory %q: a memory quantity (0: unlimited)", f.maxMemory)
	}
	vol, err := quantity.ParseMemory(f.maxVolBytes)
	if err != nil || vol < 0 {
		return gateway.QuotaOptions{}, fmt.Errorf("--default-max-volume-bytes %q: a byte quantity (0: unlimited)", f.maxVolBytes)
	}
	o := gateway.QuotaOptions{Defaults: gateway.LimitsFromFlags(f.maxSandboxes, cpu, mem), PlatformOrg: platformOrg}
	if vol > 0 {
		o.Defaults.MaxVolumeBytes = &vol
	}
	if st != nil {
		o.Store = st.Quotas()
	}
	return o, o.Validate()
}
