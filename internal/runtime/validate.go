package runtime

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

var idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidID reports whether id is 1 to maxLen characters of [a-z0-9-], not starting or
// ending with '-' (a backend's names derive from it, hence its own maximum).
func ValidID(id string, maxLen int) bool { return len(id) <= maxLen && idPattern.MatchString(id) }

// Hostname is the hostname of sandbox id, on every backend: its ID, cut to the 63
// characters of a DNS label.
func Hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

// ValidateSpec checks what every backend needs of a spec; maxIDLen is the backend's
// longest sandbox ID. Errors wrap ErrInvalidSpec or ErrInvalidImageRef.
func ValidateSpec(spec *Spec, maxIDLen int) error {
	switch {
	case spec == nil:
		return fmt.Errorf("%w: nil spec", ErrInvalidSpec)
	case !ValidID(spec.ID, maxIDLen):
		return fmt.Errorf("%w: id %q: want 1-%d characters of [a-z0-9-], not starting or ending with '-'", ErrInvalidSpec, spec.ID, maxIDLen)
	case strings.TrimSpace(spec.Image) == "":
		return fmt.Errorf("%w: empty image reference", ErrInvalidImageRef)
	case spec.Resources.MilliCPU < 0 || spec.Resources.MemoryBytes < 0 || spec.Resources.Pids < 0 || spec.Resources.DiskBytes < 0 ||
		spec.Resources.RequestMilliCPU < 0 || spec.Resources.RequestMemoryBytes < 0:
		return fmt.Errorf("%w: negative resource limit or request", ErrInvalidSpec)
	case spec.RestartLimit < 0:
		return fmt.Errorf("%w: negative restart limit", ErrInvalidSpec)
	}
	if err := spec.Security.Validate(); err != nil {
		return err
	}
	if err := ValidateVolumes(spec.Volumes, spec.VolumeMounts); err != nil {
		return err
	}
	for _, f := range spec.Files {
		if !strings.HasPrefix(f.Path, "/") || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("%w: file path %q must be absolute and clean", ErrInvalidSpec, f.Path)
		}
		if Reserved(f.Path) {
			return fmt.Errorf("%w: file path %q is under %s, reserved for the sandbox's agent", ErrInvalidSpec, f.Path, AgentDir)
		}
		if spec.Security != nil && spec.Security.ReadOnlyRootFS && !WritableWhenReadOnly(f.Path) {
			return fmt.Errorf("%w: file path %q is on the read-only root filesystem; put files under %s", ErrInvalidSpec, f.Path, strings.Join(ReadOnlyWritablePaths, ", "))
		}
	}
	return nil
}
