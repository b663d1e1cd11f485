package main

import (
	"flag"
	"fmt"
	"net/netip"

	"github.com/sandboxd/sandboxd/internal/ckptspace"
	"github.com/sandboxd/sandboxd/internal/quantity"
	"github.com/sandboxd/sandboxd/internal/reserved"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// hardeningFlags are the local backend's defence-in-depth settings, shared by the runner
// and dev commands.
type hardeningFlags struct {
	disk     string
	noUserNS bool
	// openReserved are the reserved ranges (--egress-allow-reserved) explicit cidr egress
	// rules may reach on this runner.
	openReserved listFlag
	// egressUpstreamCA and egressRoots: egress secret injection's trust (docs/secrets.md).
	egressUpstreamCA, egressRoots string
	// forkSentries bounds the forks' sandboxes waiting for their source's checkpoint
	// (local.Config.ForkSentries).
	forkSentries int
	// ociRuntime is the OCI runtime CLI of the runc class (local.Config.OCIRuntime).
	ociRuntime string
	// checkpointQuota and checkpointMinFree bound the gVisor checkpoints in the data dir
	// (local.Config.CheckpointQuotaBytes, CheckpointMinFreeBytes).
	checkpointQuota, checkpointMinFree int64
}

func (h *hardeningFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.disk, "disk", "10Gi", "size limit of each sandbox's writable root filesystem layer, e.g. 10Gi (0: none); on Kubernetes its ephemeral-storage limit")
	fs.BoolVar(&h.noUserNS, "no-userns", false, "local backend: run runc sandboxes without a user namespace of their own (root inside is then root on the host)")
	fs.StringVar(&h.egressUpstreamCA, "egress-upstream-ca", "", "PEM file of the roots the egress proxy verifies the hosts it injects egress secrets for against (default: the system roots)")
	fs.StringVar(&h.egressRoots, "egress-roots", "", "PEM bundle sandboxes with egress secrets trust besides their own CA (/etc/sandboxd-egress/bundle.pem; default: the host's system bundle; on Kubernetes at most 900 KiB, PEM certificates, written into the ConfigMap sandboxd-egress-roots-<runner-id>)")
	fs.IntVar(&h.forkSentries, "fork-sentries", 0, fmt.Sprintf("local backend: most forks holding a gVisor sandbox of their own before it is restored (waiting for their source's checkpoint), shared fairly by organizations; 0: max(4, 2×GOMAXPROCS), -1: no bound, at most %d", local.MaxForkSentries))
	fs.Int64Var(&h.checkpointQuota, "checkpoint-quota-bytes", 20<<30, "local backend: the gVisor checkpoint images in the data dir (paused sandboxes' and those being written by pauses and forks) at most this many bytes; a pause or fork whose estimate (the sandbox's memory) does not fit is refused RESOURCE_EXHAUSTED CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED (0: no quota)")
	fs.Int64Var(&h.checkpointMinFree, "checkpoint-min-free-bytes", 2<<30, "local backend: refuse a pause or fork whose checkpoint would leave less than this many bytes free on the data dir's file system (0: only the estimate must fit)")
	fs.StringVar(&h.ociRuntime, "oci-runtime", "runc", "local backend: the OCI runtime that runs the runc runtime class: runc (/usr/sbin/runc) or crun (/usr/bin/crun, cheaper per create; docs/oci-runtime.md)")
	fs.Var(&h.openReserved, "egress-allow-reserved", "CIDR of a reserved range (private, CGNAT, link-local, …) that sandboxes' explicit cidr egress rules may reach on this runner, when their policy allows (repeatable; the sandbox subnet and the host's addresses cannot be opened; \"any\" never includes it)")
}

// reservedOpen is --egress-allow-reserved as prefixes.
func (h *hardeningFlags) reservedOpen() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range h.openReserved {
		p, err := netip.ParsePrefix(s)
		if err != nil || p != p.Masked() {
			return nil, fmt.Errorf("--egress-allow-reserved %q: want a CIDR prefix such as 10.20.0.0/16", s)
		}
		if len(reserved.Default().Overlap(p)) == 0 {
			return nil, fmt.Errorf("--egress-allow-reserved %s: no reserved range there to open (egress rules reach it already)", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// validate checks --disk, --fork-sentries, --checkpoint-*, --oci-runtime and
// --egress-allow-reserved.
func (h hardeningFlags) validate() error {
	if _, err := h.diskBytes(); err != nil {
		return err
	}
	if err := h.validCheckpointSpace(); err != nil {
		return err
	}
	if err := h.validOCIRuntime(); err != nil {
		return err
	}
	if err := h.validForkSentries(); err != nil {
		return err
	}
	_, err := h.reservedOpen()
	return err
}

// apply sets cfg's disk limit, user namespace setting, fork-sentry bound, checkpoint
// space bounds and OCI runtime.
func (h *hardeningFlags) apply(cfg *stack.Config) error {
	v, err := h.diskBytes()
	if err != nil {
		return err
	}
	if err := h.validOCIRuntime(); err != nil {
		return err
	}
	cfg.OCIRuntime = h.ociRuntime
	if err := h.validForkSentries(); err != nil {
		return err
	}
	cfg.DiskBytes, cfg.NoUserNS, cfg.ForkSentries = v, h.noUserNS, h.forkSentries
	if err := h.validCheckpointSpace(); err != nil {
		return err
	}
	cfg.CheckpointQuotaBytes, cfg.CheckpointMinFreeBytes = h.checkpointQuota, h.checkpointMinFree
	cfg.EgressUpstreamCAFile, cfg.EgressRootsFile = h.egressUpstreamCA, h.egressRoots
	cfg.OpenReserved, err = h.reservedOpen()
	return err
}

// validOCIRuntime checks --oci-runtime.
func (h *hardeningFlags) validOCIRuntime() error {
	if err := local.ValidateOCIRuntime(h.ociRuntime); err != nil {
		return fmt.Errorf("--oci-runtime: %w", err)
	}
	return nil
}

// validForkSentries checks --fork-sentries.
func (h *hardeningFlags) validForkSentries() error {
	if h.forkSentries < -1 || h.forkSentries > local.MaxForkSentries {
		return fmt.Errorf("--fork-sentries %d: want 1..%d (0: the default, -1: no bound)", h.forkSentries, local.MaxForkSentries)
	}
	return nil
}

// validCheckpointSpace checks --checkpoint-quota-bytes and --checkpoint-min-free-bytes.
func (h *hardeningFlags) validCheckpointSpace() error {
	if h.checkpointQuota < 0 {
		return fmt.Errorf("--checkpoint-quota-bytes %d: want a size in bytes (0: no quota)", h.checkpointQuota)
	}
	if h.checkpointMinFree < 0 {
		return fmt.Errorf("--checkpoint-min-free-bytes %d: want a size in bytes (0: only the checkpoint's estimate must fit)", h.checkpointMinFree)
	}
	return (ckptspace.Limits{QuotaBytes: h.checkpointQuota, MinFreeBytes: h.checkpointMinFree}).Validate()
}

// diskBytes is --disk in bytes.
func (h *hardeningFlags) diskBytes() (int64, error) {
	v, err := quantity.ParseMemory(h.disk)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("--disk %q: want a size such as 10Gi, or 0 for none", h.disk)
	}
	return v, nil
}
