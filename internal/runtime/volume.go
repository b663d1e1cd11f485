package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// Volume media.
const (
	MediumDisk   = ""       // the sandbox's disk
	MediumMemory = "memory" // a tmpfs, whose pages count against the sandbox's memory
)

// Volume is a sandbox-private scratch volume: empty at creation, gone with the sandbox.
type Volume struct {
	Name string `json:"name"`
	// SizeBytes limits the volume; 0 means it shares the writable layer's disk limit
	// (disk) or is bounded by the memory limit (memory).
	SizeBytes int64  `json:"size_bytes,omitempty"`
	Medium    string `json:"medium,omitempty"`
	// RestoreDigest, when set, is the hex sha256 of a snapshot archive the volume starts
	// with instead of empty; the runner has given it to the backend's SnapshotCache
	// (PrepareSnapshot) before Create.
	RestoreDigest string `json:"restore_digest,omitempty"`
	// Keep, when set, makes the volume the backend's kept volume of that name instead of
	// a fresh one: made empty the first time, not removed with the sandbox, found again by
	// the next sandbox naming it (a build's layer cache, docs/builds.md). A disk volume
	// with a size (its quota); one live sandbox at a time. Only the runner sets it, never
	// a caller's spec (no API field converts to it). Names match KeepNamePattern.
	Keep string `json:"keep,omitempty"`
	// Managed, when set, makes the volume the backend's managed volume of that name (a
	// registered CLUSTER_LOCAL volume, docs/volumes.md): made by ManagedVolumes.EnsureManaged
	// before, never by Create, shared by every live sandbox that names it (concurrent
	// read-write mounts see one directory), kept past them until RemoveManaged. Never
	// snapshotted. The runner derives the name (ManagedVolumeName), never from a caller's
	// string alone. Names match KeepNamePattern.
	Managed string `json:"managed,omitempty"`
	// Global, when set, makes this sized disk scratch volume a sandbox's copy of a GLOBAL
	// registered volume (docs/volumes.md): it starts with the volume's latest committed
	// generation (a restore, RestoreDigest), and the runner, not the backend, uploads it
	// as the next generation when the sandbox ends (Global.CommitGeneration > 0). To the
	// backend it is a plain scratch volume. Only the gateway sets it.
	Global *GlobalVolume `json:"global,omitempty"`
}

// GlobalVolume ties a scratch volume to a GLOBAL registered volume in the blob store.
type GlobalVolume struct {
	// BlobPrefix is where the volume's generations and manifest are (ends with "/").
	BlobPrefix string `json:"blob_prefix"`
	// CommitGeneration is the generation this sandbox's copy is uploaded as when it ends
	// (it holds the volume's write lease); 0: a read-only copy, nothing is uploaded.
	CommitGeneration int64 `json:"commit_generation,omitempty"`
	// MaxSizeBytes bounds the uploaded archive (the volume's size).
	MaxSizeBytes int64 `json:"max_size_bytes,omitempty"`
}

// ManagedVolumes is implemented by backends that hold registered volumes of their own
// (Volume.Managed).
type ManagedVolumes interface {
	// ManagedUnavailable is "" when managed volumes work on this backend, else why not.
	ManagedUnavailable() string
	// EnsureManaged makes managed volume name of sizeBytes when missing, grows an
	// existing smaller one to sizeBytes (a smaller size is ignored: volumes never
	// shrink; a grow the backend cannot make now is ErrManagedBusy), checks that it is
	// usable and returns its capacity in bytes. Idempotent.
	EnsureManaged(name string, sizeBytes int64) (int64, error)
	// RemoveManaged deletes managed volume name and its content. A missing one is no
	// error. Sandboxes still mounting it keep their view of it until they end.
	RemoveManaged(name string) error
}

// ManagedSizer is implemented by ManagedVolumes backends that tell a managed volume's
// size now (0 and no error when it does not exist): the runner lets a volume it already
// holds keep a size its policy no longer allows (only growth past the bound is refused).
type ManagedSizer interface {
	ManagedSize(name string) (int64, error)
}

// ErrManagedBusy: a managed volume cannot grow while sandboxes mount it (the backend
// grows it only when none does).
var ErrManagedBusy = errors.New("managed volume in use")

// ManagedVolumeName is the backend name of the registered volume of organization org
// whose claim is claim: distinct per (organization, claim), never the caller's string.
func ManagedVolumeName(org, claim string) string {
	h := sha256.Sum256([]byte(org + "\x00" + claim))
	return "rv-" + hex.EncodeToString(h[:20])
}

// KeepNamePattern is what a Volume.Keep name looks like: a backend uses it as one path
// element, so it is never a caller's string (the runner derives it from a hash).
var KeepNamePattern = newLazyRegexp(`^[a-z0-9][a-z0-9-]{0,63}$`)

// KeptVolume is a kept volume (Volume.Keep) as KeptVolumes lists it.
type KeptVolume struct {
	Name     string
	LastUsed time.Time // when a sandbox last mounted it
	InUse    bool      // a live sandbox of this backend mounts it
}

// KeptVolumes is implemented by backends that keep volumes past their sandbox
// (Volume.Keep).
type KeptVolumes interface {
	// KeepUnavailable is "" when Volume.Keep works on this backend, else why not.
	KeepUnavailable() string
	// ListKept lists the kept volumes, least recently used first.
	ListKept() ([]KeptVolume, error)
	// RemoveKept deletes the kept volume name and its content; ErrKeptInUse while a
	// sandbox uses it. A missing volume is not an error.
	RemoveKept(name string) error
}

// ErrKeptInUse: a live sandbox mounts the kept volume.
var ErrKeptInUse = errors.New("the kept volume is in use by a sandbox")

// VolumeMount mounts a volume (or a sub-directory of it, made when missing) at Path.
type VolumeMount struct {
	Volume   string `json:"volume"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	SubPath  string `json:"sub_path,omitempty"`
}

// reservedMountPaths are where no volume may be mounted (or above which).
var reservedMountPaths = []string{"/proc", "/sys", "/dev", "/.sandboxd", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// ValidateVolumes checks spec's volumes and mounts. Errors wrap ErrInvalidSpec.
func ValidateVolumes(vols []Volume, mounts []VolumeMount) error {
	names := map[string]bool{}
	for _, v := range vols {
		switch {
		case v.Name == "" || names[v.Name]:
			return fmt.Errorf("%w: volume name %q: empty or repeated", ErrInvalidSpec, v.Name)
		case v.SizeBytes < 0:
			return fmt.Errorf("%w: volume %q: negative size", ErrInvalidSpec, v.Name)
		case v.Medium != MediumDisk && v.Medium != MediumMemory:
			return fmt.Errorf("%w: volume %q: unknown medium %q", ErrInvalidSpec, v.Name, v.Medium)
		case v.Keep != "" && !KeepNamePattern.MatchString(v.Keep):
			return fmt.Errorf("%w: volume %q: kept volume name %q does not match %s", ErrInvalidSpec, v.Name, v.Keep, KeepNamePattern)
		case v.Managed != "" && !KeepNamePattern.MatchString(v.Managed):
			return fmt.Errorf("%w: volume %q: managed volume name %q does not match %s", ErrInvalidSpec, v.Name, v.Managed, KeepNamePattern)
		case v.Managed != "" && (v.Keep != "" || v.Medium != MediumDisk || v.RestoreDigest != ""):
			return fmt.Errorf("%w: volume %q: a managed volume is a disk volume, neither kept nor restored", ErrInvalidSpec, v.Name)
		case v.Global != nil && (v.Managed != "" || v.Keep != "" || v.Medium != MediumDisk || v.SizeBytes <= 0 ||
			v.Global.BlobPrefix == "" || !strings.HasSuffix(v.Global.BlobPrefix, "/") || v.Global.CommitGeneration < 0 || v.Global.MaxSizeBytes < 0):
			return fmt.Errorf("%w: volume %q: a GLOBAL volume's copy is a sized disk volume with a blob prefix, neither managed nor kept", ErrInvalidSpec, v.Name)
		case v.Keep != "" && (v.Medium != MediumDisk || v.SizeBytes == 0 || v.RestoreDigest != ""):
			return fmt.Errorf("%w: volume %q: a kept volume is a disk volume with a size, restored from nothing", ErrInvalidSpec, v.Name)
		}
		names[v.Name] = true
	}
	paths := map[string]bool{}
	for _, m := range mounts {
		if !names[m.Volume] {
			return fmt.Errorf("%w: mount of %q: no such volume", ErrInvalidSpec, m.Volume)
		}
		if err := CheckMountPath(m.Path); err != nil {
			return fmt.Errorf("%w: mount of %q: %w", ErrInvalidSpec, m.Volume, err)
		}
		if paths[m.Path] {
			return fmt.Errorf("%w: two mounts at %s", ErrInvalidSpec, m.Path)
		}
		paths[m.Path] = true
		if err := CheckSubPath(m.SubPath); err != nil {
			return fmt.Errorf("%w: mount of %q: %w", ErrInvalidSpec, m.Volume, err)
		}
	}
	return nil
}

// Bounds of a sub_path, shared by every backend (Linux's PATH_MAX and NAME_MAX: a longer
// one could never be made, and a Kubernetes runner's fill checks its sub_dirs by the same
// bounds, fsarchive.MaxPath and MaxName).
const (
	MaxSubPath     = 4096
	MaxSubPathName = 255
)

// CheckSubPath accepts "" and clean relative paths that stay inside the volume, at most
// MaxSubPath bytes, each component at most MaxSubPathName.
func CheckSubPath(s string) error {
	if len(s) > MaxSubPath {
		return fmt.Errorf("sub_path is %d bytes, at most %d", len(s), MaxSubPath)
	}
	if s != "" && (path.IsAbs(s) || path.Clean(s) != s || s == ".." || strings.HasPrefix(s, "../") || strings.ContainsRune(s, 0)) {
		return fmt.Errorf("sub_path %q must be a clean relative path inside the volume", s)
	}
	for c := range strings.SplitSeq(s, "/") {
		if len(c) > MaxSubPathName {
			return fmt.Errorf("sub_path has a component of %d bytes, at most %d", len(c), MaxSubPathName)
		}
	}
	return nil
}

// CheckMountPath accepts absolute, clean paths other than / that are not, and do not
// contain, a path the sandbox's runtime mounts itself (/proc, /sys, /dev, the agent's).
func CheckMountPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path %q must be absolute, clean and not /", p)
	}
	for _, r := range reservedMountPaths {
		if p == r || strings.HasPrefix(p, r+"/") || strings.HasPrefix(r, p+"/") {
			return fmt.Errorf("path %q is reserved (%s)", p, r)
		}
	}
	return nil
}

// DefaultClaimBytes is the size of a claim a ClaimVolumes backend makes for a registered
// volume that asks for none (Claim.SizeBytes 0): the one place of that default.
const DefaultClaimBytes int64 = 10 << 30

// Claim is a registered volume held as an orchestrator's claim (a Kubernetes
// PersistentVolumeClaim named Name in the backend's namespace; docs/volumes.md).
type Claim struct {
	Org  string // the organization that registered the volume
	Name string // the claim's name (VolumeSpec.pvc.claim_name, a DNS-1123 label)
	// Managed is the registered volume's backend name (ManagedVolumeName): a sandbox's
	// Volume.Managed finds the claim by it.
	Managed string
	// SizeBytes is the size of a claim the backend makes; 0: DefaultClaimBytes. An
	// existing claim keeps its own.
	SizeBytes int64
	// StorageClass is the class of a claim the backend makes (the runner policy's
	// base.volume_storage_class); "": the cluster's default class.
	StorageClass string
	// AllowedStorageClasses (the policy's constraints.volumes.allowed_storage_classes)
	// bound the class of every claim, made or adopted; nil: any.
	AllowedStorageClasses []string
}

// ClaimState is what EnsureClaim found of a claim.
type ClaimState struct {
	CapacityBytes int64 // its bound volume's capacity, else what it requests
	// AccessModes are the claim's (bound: its volume's), e.g. ["ReadWriteOnce"]: with
	// ReadWriteOnce or ReadWriteOncePod the sandboxes mounting it share one node.
	AccessModes []string
}

// ClaimVolumes is implemented by backends whose registered volumes are claims in one
// namespace (the Kubernetes backend). A sandbox mounts one by Volume.Managed.
type ClaimVolumes interface {
	// ClaimNamespace is the namespace the backend's claims live in.
	ClaimNamespace() string
	// EnsureClaim adopts the claim when it exists and may be used (ErrClaimIneligible
	// otherwise), else makes it; it returns the claim's capacity and access modes.
	EnsureClaim(ctx context.Context, c Claim) (ClaimState, error)
	// RemoveClaim deletes the claim when the backend made it, else only lets go of it.
	// A missing one is no error.
	RemoveClaim(ctx context.Context, c Claim) error
}

// ClaimSizer is implemented by ClaimVolumes backends that tell an existing claim's size
// (its capacity, else what it asks for; 0 and no error when it does not exist or is not
// granted to c.Org): the runner lets a claim that already exists keep a size its policy
// no longer allows (only a claim it would make past the bound is refused), as
// ManagedSizer does for managed volumes.
type ClaimSizer interface {
	ClaimSize(ctx context.Context, c Claim) (int64, error)
}

// ErrClaimIneligible: the named claim exists but this organization may not use it, or it
// is not usable (its class, its phase). Errors wrap it with the reason.
var ErrClaimIneligible = errors.New("the claim is not eligible")
