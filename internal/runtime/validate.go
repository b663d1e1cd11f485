package runtime

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

var idPattern = newLazyRegexp(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

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
// longest sandbox ID. Errors wrap ErrInvalidSpec or ErrInvalidImageRef, and name the
// container at fault in a multi-container spec.
func ValidateSpec(spec *Spec, maxIDLen int) error {
	switch {
	case spec == nil:
		return fmt.Errorf("%w: nil spec", ErrInvalidSpec)
	case !ValidID(spec.ID, maxIDLen):
		return fmt.Errorf("%w: id %q: want 1-%d characters of [a-z0-9-], not starting or ending with '-'", ErrInvalidSpec, spec.ID, maxIDLen)
	case len(spec.Sidecars)+len(spec.InitContainers) >= MaxContainers:
		return fmt.Errorf("%w: %d containers: at most %d", ErrInvalidSpec, 1+len(spec.Sidecars)+len(spec.InitContainers), MaxContainers)
	}
	if err := validateEngine(spec); err != nil {
		return err
	}
	if err := ValidateVolumes(spec.Volumes, nil); err != nil {
		return err
	}
	multi := spec.Multi()
	names := map[string]bool{}
	for _, c := range spec.AllContainers() {
		_, init := spec.Find(c.Name)
		if multi || c.Name != "" {
			switch {
			case !ValidContainerName(c.Name):
				return fmt.Errorf("%w: container name %q: want a DNS-1123 label (1-63 characters of [a-z0-9-], not starting or ending with '-')", ErrInvalidSpec, c.Name)
			case names[c.Name]:
				return fmt.Errorf("%w: two containers named %q", ErrInvalidSpec, c.Name)
			}
			names[c.Name] = true
		}
		if err := validateContainer(spec, c, init); err != nil {
			if multi {
				return fmt.Errorf("container %q: %w", c.Name, err)
			}
			return err
		}
	}
	if err := checkDependencies(spec); err != nil {
		return err
	}
	if len(spec.HostAliases) > MaxHostAliases {
		return fmt.Errorf("%w: %d host aliases: at most %d", ErrInvalidSpec, len(spec.HostAliases), MaxHostAliases)
	}
	for _, h := range spec.HostAliases {
		if !ValidHostAlias(h) {
			return fmt.Errorf("%w: host alias %q: want a DNS name of lowercase labels", ErrInvalidSpec, h)
		}
	}
	return nil
}

// Bounds of a group: containers (init containers included), tmpfs mounts per container
// and host aliases per sandbox.
const (
	MaxContainers  = 16
	MaxTmpfs       = 16
	MaxHostAliases = 64
)

var containerName = newLazyRegexp(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidContainerName reports whether name is a DNS-1123 label, as container names are.
func ValidContainerName(name string) bool { return containerName.MatchString(name) }

var hostAlias = newLazyRegexp(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)

// ValidHostAlias reports whether h may be a name in /etc/hosts: lowercase DNS labels,
// at most 253 characters.
func ValidHostAlias(h string) bool { return len(h) <= 253 && hostAlias.MatchString(h) }

func validateContainer(spec *Spec, c *Container, init bool) error {
	r := c.Resources
	switch {
	case strings.TrimSpace(c.Image) == "":
		return fmt.Errorf("%w: empty image reference", ErrInvalidImageRef)
	case r.MilliCPU < 0 || r.MemoryBytes < 0 || r.Pids < 0 || r.DiskBytes < 0 || r.RequestMilliCPU < 0 || r.RequestMemoryBytes < 0:
		return fmt.Errorf("%w: negative resource limit or request", ErrInvalidSpec)
	case c.RestartLimit < 0:
		return fmt.Errorf("%w: negative restart limit", ErrInvalidSpec)
	case init && (len(c.DependsOn) > 0 || c.StartupProbe != nil):
		return fmt.Errorf("%w: an init container takes no depends_on and no startup probe", ErrInvalidSpec)
	}
	if err := c.Security.Validate(); err != nil {
		return err
	}
	if err := ValidateVolumes(spec.Volumes, c.VolumeMounts); err != nil {
		return err
	}
	if len(c.Tmpfs) > MaxTmpfs {
		return fmt.Errorf("%w: %d tmpfs mounts: at most %d", ErrInvalidSpec, len(c.Tmpfs), MaxTmpfs)
	}
	for _, t := range c.Tmpfs {
		if err := CheckMountPath(t); err != nil {
			return fmt.Errorf("%w: tmpfs: %w", ErrInvalidSpec, err)
		}
	}
	if p := c.StartupProbe; p != nil {
		if len(p.Exec) == 0 || p.InitialDelay < 0 || p.Period < 0 || p.Timeout < 0 || p.FailureThreshold < 0 {
			return fmt.Errorf("%w: startup probe: want a command and no negative timing", ErrInvalidSpec)
		}
	}
	for _, f := range c.Files {
		if !strings.HasPrefix(f.Path, "/") || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("%w: file path %q must be absolute and clean", ErrInvalidSpec, f.Path)
		}
		if Reserved(f.Path) {
			return fmt.Errorf("%w: file path %q is under %s, reserved for the sandbox's agent", ErrInvalidSpec, f.Path, AgentDir)
		}
		if c.Security != nil && c.Security.ReadOnlyRootFS && !WritableWhenReadOnly(f.Path) {
			return fmt.Errorf("%w: file path %q is on the read-only root filesystem; put files under %s", ErrInvalidSpec, f.Path, strings.Join(ReadOnlyWritablePaths, ", "))
		}
	}
	return nil
}

// checkDependencies checks that every DependsOn names another (non-init) container of
// the spec with a known condition, that "healthy" has a probe to pass, and that the
// dependencies have no cycle.
func checkDependencies(spec *Spec) error {
	cs := spec.Containers()
	byName := map[string]*Container{}
	for _, c := range cs {
		byName[c.ContainerName()] = c
	}
	for _, c := range cs {
		for _, d := range c.DependsOn {
			dep := byName[d.Container]
			switch {
			case dep == nil || dep == c:
				return fmt.Errorf("%w: container %q depends on %q: no such other container", ErrInvalidSpec, c.ContainerName(), d.Container)
			case d.Condition != ConditionStarted && d.Condition != ConditionHealthy && d.Condition != ConditionCompleted:
				return fmt.Errorf("%w: container %q depends on %q: unknown condition %q", ErrInvalidSpec, c.ContainerName(), d.Container, d.Condition)
			case d.Condition == ConditionHealthy && dep.StartupProbe == nil:
				return fmt.Errorf("%w: container %q waits for %q to be healthy, which has no health check", ErrInvalidSpec, c.ContainerName(), d.Container)
			}
		}
	}
	if cycle := DependencyCycle(spec); cycle != nil {
		return fmt.Errorf("%w: containers depend on each other in a cycle: %s", ErrInvalidSpec, strings.Join(cycle, " -> "))
	}
	return nil
}

// DependencyCycle returns one cycle of the spec's DependsOn (names, the first repeated
// at the end), or nil when there is none.
func DependencyCycle(spec *Spec) []string {
	deps := map[string][]string{}
	var order []string
	for _, c := range spec.Containers() {
		n := c.ContainerName()
		order = append(order, n)
		for _, d := range c.DependsOn {
			deps[n] = append(deps[n], d.Container)
		}
	}
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(n string) []string
	visit = func(n string) []string {
		switch state[n] {
		case onPath:
			i := slices.Index(path, n)
			return append(slices.Clone(path[i:]), n)
		case done:
			return nil
		}
		state[n] = onPath
		path = append(path, n)
		for _, d := range deps[n] {
			if c := visit(d); c != nil {
				return c
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		return nil
	}
	for _, n := range order {
		if c := visit(n); c != nil {
			return c
		}
	}
	return nil
}
