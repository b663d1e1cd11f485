package runtime

import (
	"fmt"
	"slices"
	"strings"
)

// Security is a sandbox's security context (the wire SecurityContext), already checked
// against the runner's policy. nil and the zero value mean the platform defaults: root in
// the sandbox, the default capability set, no_new_privs, the runtime's default seccomp
// profile, a writable root filesystem.
type Security struct {
	// RunAsUser and RunAsGroup are the main command's and the default exec user (nil:
	// the image's user, group from the image or /etc/passwd).
	RunAsUser  *uint32 `json:"run_as_user,omitempty"`
	RunAsGroup *uint32 `json:"run_as_group,omitempty"`
	// ReadOnlyRootFS mounts the root filesystem read-only; ReadOnlyWritablePaths stay
	// writable (empty, sandbox-private tmpfs mounts).
	ReadOnlyRootFS bool `json:"read_only_root_fs,omitempty"`
	// CapAdd and CapDrop change the default capability set: canonical names
	// ("CAP_NET_ADMIN"), or "ALL" in CapDrop. Adds apply after drops.
	CapAdd  []string `json:"cap_add,omitempty"`
	CapDrop []string `json:"cap_drop,omitempty"`
	// AllowPrivilegeEscalation turns no_new_privs off (setuid binaries gain privileges,
	// within the capability set); false is the default.
	AllowPrivilegeEscalation bool `json:"allow_privilege_escalation,omitempty"`
	// SeccompProfile is "" or SeccompRuntimeDefault, the only profile offered.
	SeccompProfile string `json:"seccomp_profile,omitempty"`
	// Privileged is carried so a backend can refuse it: the platform allows no
	// privileged containers (policy.Platform.PrivilegedAllowed), and Validate rejects it.
	Privileged bool `json:"privileged,omitempty"`
}

// SeccompRuntimeDefault is the runtime's default seccomp profile.
const SeccompRuntimeDefault = "RuntimeDefault"

// ReadOnlyWritablePaths are the paths that stay writable, each an empty tmpfs counted
// against the sandbox's memory, when the root filesystem is read-only. (The agent's state
// dir and /dev/shm are writable anyway.)
var ReadOnlyWritablePaths = []string{"/tmp", "/var/tmp", "/run"}

// Capabilities are the Linux capabilities by canonical name.
var Capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// CanonicalCapability returns "CAP_X" for "x", "X", "cap_x" or "CAP_X", and whether X is
// a Linux capability.
func CanonicalCapability(name string) (string, bool) {
	c := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(c, "CAP_") {
		c = "CAP_" + c
	}
	return c, slices.Contains(Capabilities, c)
}

// IsDefault reports whether s asks for nothing but the platform defaults.
func (s *Security) IsDefault() bool {
	return s == nil || (s.RunAsUser == nil && s.RunAsGroup == nil && s.OCIDefault())
}

// OCIDefault reports whether s leaves the container's runtime configuration (root
// filesystem, capabilities, no_new_privs, seccomp) at the defaults: only the user the
// agent runs commands as may differ.
func (s *Security) OCIDefault() bool {
	return s == nil || (!s.ReadOnlyRootFS && len(s.CapAdd) == 0 && len(s.CapDrop) == 0 && !s.AllowPrivilegeEscalation && !s.Privileged)
}

// Validate checks s's shape; nil is valid. Errors wrap ErrInvalidSpec.
func (s *Security) Validate() error {
	if s == nil {
		return nil
	}
	if s.Privileged {
		return fmt.Errorf("%w: privileged containers are not supported", ErrInvalidSpec)
	}
	if p := s.SeccompProfile; p != "" && p != SeccompRuntimeDefault {
		return fmt.Errorf("%w: seccomp profile %q: only %q is offered", ErrInvalidSpec, p, SeccompRuntimeDefault)
	}
	for _, c := range s.CapAdd {
		if canon, ok := CanonicalCapability(c); !ok || canon != c {
			return fmt.Errorf("%w: capability to add %q: want a canonical Linux capability name such as CAP_NET_ADMIN", ErrInvalidSpec, c)
		}
	}
	for _, c := range s.CapDrop {
		if canon, ok := CanonicalCapability(c); c != "ALL" && (!ok || canon != c) {
			return fmt.Errorf("%w: capability to drop %q: want ALL or a canonical Linux capability name such as CAP_NET_RAW", ErrInvalidSpec, c)
		}
	}
	return nil
}

// WritableWhenReadOnly reports whether p (absolute, clean) is on a path that stays
// writable under a read-only root filesystem.
func WritableWhenReadOnly(p string) bool {
	for _, w := range ReadOnlyWritablePaths {
		if p != w && strings.HasPrefix(p, w+"/") {
			return true
		}
	}
	return false
}

// RunAs is the agent's user string for s over the image's user: "uid", "uid:gid",
// "user:gid" (see agentconfig.Config.User).
func (s *Security) RunAs(imageUser string) string {
	if s == nil || (s.RunAsUser == nil && s.RunAsGroup == nil) {
		return imageUser
	}
	u, g, hasGroup := strings.Cut(imageUser, ":")
	if s.RunAsUser != nil {
		u, g, hasGroup = fmt.Sprint(*s.RunAsUser), "", false
	}
	if u == "" {
		u = "0"
	}
	if s.RunAsGroup != nil {
		g, hasGroup = fmt.Sprint(*s.RunAsGroup), true
	}
	if hasGroup {
		return u + ":" + g
	}
	return u
}
