package runner

import (
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Lifetime bounds: 0 asks for the default; more than 30 days is refused, never clamped.
const (
	DefaultLifetime = 600 * time.Second
	MaxLifetime     = 30 * 24 * time.Hour
	maxRestartLimit = 100
)

// idPattern keeps IDs usable as DNS labels (endpoint addresses embed them) and as
// cgroup, file and interface-hash names.
var idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	Spec runtime.Spec
	// Lifetime is the maximum run time; 0 means DefaultLifetime.
	Lifetime time.Duration
	// Restores are the snapshots scratch volumes start from, by volume name; the runner
	// downloads each (once per digest) before the backend creates the sandbox and sets
	// the volume's RestoreDigest.
	Restores map[string]SnapshotSource
}

// applyKeep clears the Keep of every volume of req's spec and sets those keep names
// (kept volume name by volume name; only the runner's own image builds give any).
func applyKeep(req *CreateRequest, keep map[string]string) error {
	for i := range req.Spec.Volumes {
		req.Spec.Volumes[i].Keep = ""
	}
	for vol, name := range keep {
		i := slices.IndexFunc(req.Spec.Volumes, func(v runtime.Volume) bool { return v.Name == vol })
		if i < 0 {
			return fmt.Errorf("%w: kept volume %s: no volume %q", runtime.ErrInvalidSpec, name, vol)
		}
		req.Spec.Volumes[i].Keep = name
	}
	return nil
}

// validate checks a request's shape and fills defaults, reporting every problem at once.
func validate(req *CreateRequest) error {
	var vs violations
	s := &req.Spec
	if s.ID != "" && !idPattern.MatchString(s.ID) {
		vs.add("sandbox_id", "must be 1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit")
	}
	if strings.TrimSpace(s.Image) == "" {
		vs.add("spec.containers[0].image", "is required")
	}
	switch {
	case req.Lifetime < 0:
		vs.add("spec.max_lifetime_seconds", "must not be negative, got %s", req.Lifetime)
	case req.Lifetime > MaxLifetime:
		vs.add("spec.max_lifetime_seconds", "must be at most %d (30 days), got %d", int64(MaxLifetime/time.Second), int64(req.Lifetime/time.Second))
	case req.Lifetime == 0:
		req.Lifetime = DefaultLifetime
	}
	total := 0
	for i, c := range s.AllContainers() {
		prefix, restart := "spec.containers[0]", "restart_limit"
		switch {
		case i < len(s.InitContainers):
			prefix = fmt.Sprintf("spec.init_containers[%d]", i)
			restart = prefix + ".restart_limit"
		case c != &s.Container:
			prefix = fmt.Sprintf("spec.containers[%d]", i-len(s.InitContainers))
			restart = prefix + ".restart_limit"
		}
		if c != &s.Container && strings.TrimSpace(c.Image) == "" {
			vs.add(prefix+".image", "is required")
		}
		total += validateContainer(&vs, prefix, restart, c)
	}
	if total > runtime.MaxFilesBytes {
		// Over all containers: the runner keeps the spec (and its files) until it starts.
		vs.add("spec.containers[0].files", "total %d bytes over the sandbox's containers, at most %d allowed", total, runtime.MaxFilesBytes)
	}
	if err := runtime.ValidateVolumes(s.Volumes, s.VolumeMounts); err != nil {
		vs.add("spec.volumes", "%v", err)
	} else {
		for i, c := range s.Sidecars {
			if err := runtime.ValidateVolumes(s.Volumes, c.VolumeMounts); err != nil {
				vs.add(fmt.Sprintf("spec.containers[%d].volume_mounts", 1+i), "%v", err)
			}
		}
		for i, c := range s.InitContainers {
			if err := runtime.ValidateVolumes(s.Volumes, c.VolumeMounts); err != nil {
				vs.add(fmt.Sprintf("spec.init_containers[%d].volume_mounts", i), "%v", err)
			}
		}
	}
	if len(vs) == 0 && (s.Multi() || s.Name != "") {
		// What binds the containers together (names, dependencies, host aliases, the
		// volumes each mounts): the one check every backend makes, here so the sandbox
		// is refused before it is accepted. The ID is checked above (it may be empty yet).
		check := *s
		check.ID = "x"
		if err := runtime.ValidateSpec(&check, 253); err != nil {
			vs.add("spec.containers", "%v", err)
		}
	}
	// The gateway checked the rules too; a runner checks again because a backend turns
	// them into firewall state, where a malformed rule could mean more access, not less.
	ValidateNetwork("spec.network.", s.Network, vs.add)
	if s.ShareTokenHash != "" && !edge.ValidShareTokenHash(s.ShareTokenHash) {
		// The edge would refuse the sandbox's routes: refuse the sandbox instead.
		vs.add("share_token_hash", "must be a hex SHA-256 (64 lowercase hex digits)")
	}
	return vs.err()
}

// validateContainer checks one container of a spec (field names under prefix, its
// restart limit as restartField) and returns the bytes of its files.
func validateContainer(vs *violations, prefix, restartField string, c *runtime.Container) int {
	r := c.Resources
	for _, q := range []struct {
		field string
		v     int64
	}{
		{prefix + ".resources.cpu", r.MilliCPU},
		{prefix + ".resources.memory", r.MemoryBytes},
		{prefix + ".resources.pids", r.Pids},
		{prefix + ".resource_requirements.requests.cpu", r.RequestMilliCPU},
		{prefix + ".resource_requirements.requests.memory", r.RequestMemoryBytes},
	} {
		if q.v < 0 {
			vs.add(q.field, "must not be negative, got %d", q.v)
		}
	}
	if r.MilliCPU > 0 && r.RequestMilliCPU > r.MilliCPU {
		vs.add(prefix+".resource_requirements.requests.cpu", "%dm is above the limit of %dm; a request may not exceed its limit", r.RequestMilliCPU, r.MilliCPU)
	}
	if r.MemoryBytes > 0 && r.RequestMemoryBytes > r.MemoryBytes {
		vs.add(prefix+".resource_requirements.requests.memory", "%d bytes is above the limit of %d bytes; a request may not exceed its limit", r.RequestMemoryBytes, r.MemoryBytes)
	}
	if r.MemoryBytes > 0 && r.MemoryBytes < 8<<20 {
		vs.add(prefix+".resources.memory", "must be at least 8Mi, got %d bytes", r.MemoryBytes)
	}
	switch {
	case c.RestartLimit < 0:
		vs.add(restartField, "must not be negative, got %d", c.RestartLimit)
	case c.RestartLimit > maxRestartLimit:
		vs.add(restartField, "must be at most %d, got %d", maxRestartLimit, c.RestartLimit)
	}
	if c.WorkingDir != "" && !path.IsAbs(c.WorkingDir) {
		vs.add(prefix+".working_dir", "must be an absolute path, got %q", c.WorkingDir)
	}
	switch {
	case strings.ContainsRune(c.Command, 0):
		vs.add(prefix+".command", "must not contain NUL bytes")
	case len(c.Command) > runtime.MaxArgBytes:
		vs.add(prefix+".command", "is %d bytes, at most %d allowed", len(c.Command), runtime.MaxArgBytes)
	}
	cmd := 0
	if c.Command != "" {
		cmd = 1
	}
	runtime.CheckArgs(prefix+".args", c.Args, cmd, len(c.Command), vs.add)
	runtime.CheckEnv(prefix+".environment_variables", c.Env, vs.add)
	if n := len(c.Files); n > runtime.MaxFiles {
		vs.add(prefix+".files", "has %d files, at most %d allowed", n, runtime.MaxFiles)
	}
	total := 0
	seen := map[string]bool{}
	for i, f := range c.Files {
		if i >= runtime.MaxFiles {
			break // reported above; do not also report each of thousands
		}
		field := fmt.Sprintf(prefix+".files[%d].path", i)
		if err := checkPath(f.Path); err != nil {
			vs.add(field, "%v", err)
		} else if err := runtime.CheckFilePath(path.Clean(f.Path)); err != nil {
			vs.add(field, "%v", err)
		} else if seen[path.Clean(f.Path)] {
			vs.add(field, "duplicate path %q", f.Path)
		}
		seen[path.Clean(f.Path)] = true
		if len(f.Content) > runtime.MaxFileBytes {
			vs.add(fmt.Sprintf(prefix+".files[%d].content", i), "is %d bytes, at most %d allowed", len(f.Content), runtime.MaxFileBytes)
		}
		total += len(f.Content)
	}
	if sec := c.Security; sec != nil {
		if err := sec.Validate(); err != nil {
			vs.add(prefix+".security_context", "%v", err)
		}
		for i, f := range c.Files {
			if sec.ReadOnlyRootFS && !runtime.WritableWhenReadOnly(path.Clean(f.Path)) {
				vs.add(fmt.Sprintf(prefix+".files[%d].path", i), "%q is on the read-only root filesystem (security_context.read_only_root_filesystem); put files under %s",
					f.Path, strings.Join(runtime.ReadOnlyWritablePaths, ", "))
			}
		}
	}
	if total > runtime.MaxFilesBytes {
		vs.add(prefix+".files", "total %d bytes, at most %d allowed", total, runtime.MaxFilesBytes)
	}
	return total
}

// checkPath accepts absolute paths without NUL bytes or '..' elements (the agent's own
// rule for file paths, plus absolute: there is no working directory yet at creation).
func checkPath(p string) error {
	if err := agent.ValidatePath(p); err != nil {
		return err
	}
	switch {
	case !path.IsAbs(p):
		return fmt.Errorf("must be absolute, got %q", p)
	case path.Clean(p) == "/":
		return fmt.Errorf("must name a file, got %q", p)
	}
	return nil
}

// validateSecretEnv checks the secret environment of a sandbox's containers (before
// cloneSpec drops it): at most runtime.MaxSecretEnvVars in all, each container's as
// runtime.CheckEnv says, alone and together with its plain environment. Violations name
// variables, never values.
func validateSecretEnv(cs []*runtime.Container) error {
	var vs violations
	n := 0
	for i, c := range cs {
		n += len(c.SecretRefs)
		if len(c.SecretEnv) == 0 {
			continue
		}
		n += len(c.SecretEnv)
		field := fmt.Sprintf("spec.containers[%d].secret_stores", i)
		runtime.CheckEnv(field, c.SecretEnv, vs.add)
		all := maps.Clone(c.Env)
		if all == nil {
			all = map[string]string{}
		}
		maps.Copy(all, c.SecretEnv)
		if len(vs) == 0 {
			runtime.CheckEnv(field, all, vs.add)
		}
	}
	if n > runtime.MaxSecretEnvVars {
		vs.add("spec.containers.secret_stores", "%d secrets in all, at most %d per sandbox", n, runtime.MaxSecretEnvVars)
	}
	return vs.err()
}
