package main

import (
	"flag"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// hardeningFlags are the local backend's defence-in-depth settings, shared by the runner
// and dev commands.
type hardeningFlags struct {
	disk     string
	noUserNS bool
}

func (h *hardeningFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.disk, "disk", "10Gi", "size limit of each sandbox's writable root filesystem layer, e.g. 10Gi (0: none); on Kubernetes its ephemeral-storage limit")
	fs.BoolVar(&h.noUserNS, "no-userns", false, "local backend: run runc sandboxes without a user namespace of their own (root inside is then root on the host)")
}

// apply sets cfg's disk limit and user namespace setting.
func (h *hardeningFlags) apply(cfg *stack.Config) error {
	v, err := h.diskBytes()
	if err != nil {
		return err
	}
	cfg.DiskBytes, cfg.NoUserNS = v, h.noUserNS
	return nil
}

// diskBytes is --disk in bytes.
func (h *hardeningFlags) diskBytes() (int64, error) {
	v, err := quantity.ParseMemory(h.disk)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("--disk %q: want a size such as 10Gi, or 0 for none", h.disk)
	}
	return v, nil
}
