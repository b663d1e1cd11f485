package kubernetes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// agentCaps are what the agent (PID 1, root) keeps when it runs commands as another
// user, as under the local backend: switch to the user, hand it the files it writes,
// reach into its dirs, signal its processes. The kernel clears them when the agent
// switches a command to that user and no_new_privs (allowPrivilegeEscalation false)
// keeps them cleared, so the commands run with none.
var agentCaps = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"}

// readOnlyTmpBytes is the size of each writable memory emptyDir under a read-only root
// (as the local backend's tmpfs mounts: counted against the memory limit).
const readOnlyTmpBytes = 256 << 20

// securityFor translates a security context into the main container's securityContext
// and the user the agent runs commands as ("" = the container's own user).
//
// The agent is the container's PID 1. As under the local backend, a run-as user or
// group does not change PID 1's user: the container runs as root (runAsUser 0) and the
// agent starts every command as the user (agentconfig.Config.User), keeping agentCaps,
// so spec files, the files API and exec behave alike on both backends. imageUser is the
// image's USER (needed only when a group is set without a user).
//
// The seccomp profile is always the runtime's default (the local backend always applies
// one); Kubernetes would otherwise run the container unconfined.
func securityFor(sec *runtime.Security, imageUser string) (*corev1.SecurityContext, string) {
	sc := &corev1.SecurityContext{
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if sec.IsDefault() {
		return sc, ""
	}
	no, yes := false, true
	sc.AllowPrivilegeEscalation = &no
	if sec.AllowPrivilegeEscalation {
		sc.AllowPrivilegeEscalation = &yes
	}
	if sec.ReadOnlyRootFS {
		sc.ReadOnlyRootFilesystem = &yes
	}
	user := ""
	if sec.RunAsUser != nil || sec.RunAsGroup != nil {
		user = sec.RunAs(imageUser)
		sc.RunAsUser, sc.RunAsGroup = ptr(int64(0)), ptr(int64(0))
	}
	var add, drop []corev1.Capability
	for _, c := range sec.CapDrop {
		drop = append(drop, corev1.Capability(strings.TrimPrefix(c, "CAP_")))
	}
	for _, c := range sec.CapAdd {
		add = append(add, corev1.Capability(strings.TrimPrefix(c, "CAP_")))
	}
	// Without drops the runtime's default set already holds agentCaps.
	if len(drop) > 0 && nonRootUser(user) {
		for _, c := range agentCaps {
			if !slices.Contains(add, c) {
				add = append(add, c)
			}
		}
	}
	if len(add) > 0 || len(drop) > 0 {
		sc.Capabilities = &corev1.Capabilities{Add: add, Drop: drop}
	}
	return sc, user
}

// gateSecurityContext is the gate container's: what the Pod Security Standard
// "restricted" asks (non-root, no privilege escalation, no capabilities, RuntimeDefault
// seccomp), plus a read-only root. The gate needs no privilege: it copies the binaries
// into an emptyDir (mode 0777), listens on an unprivileged port, reads its Secret
// (mode 0444), the agent's status.json (0644) and connects to the agent's socket, which
// exec-agent hands to gate.UID (gate.ListenAgent).
func gateSecurityContext() *corev1.SecurityContext {
	yes, no := true, false
	return &corev1.SecurityContext{
		RunAsNonRoot:             &yes,
		RunAsUser:                ptr(int64(gate.UID)),
		RunAsGroup:               ptr(int64(gate.UID)),
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// nonRootUser reports whether an agent user string ("uid[:gid]", "name[:group]") names a
// user other than root.
func nonRootUser(user string) bool {
	u, _, _ := strings.Cut(user, ":")
	return u != "" && u != "0" && u != "root"
}

// volumesFor translates the spec's scratch volumes into emptyDirs and the main
// container's mounts, plus the memory emptyDirs that keep ReadOnlyWritablePaths
// writable under a read-only root (unless a volume is mounted there). Pod volume names
// are generated: the spec's names need not be DNS labels.
func volumesFor(spec *runtime.Spec) ([]corev1.Volume, []corev1.VolumeMount) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	index := map[string]string{}
	for i, v := range spec.Volumes {
		name := "vol-" + strconv.Itoa(i)
		index[v.Name] = name
		ed := &corev1.EmptyDirVolumeSource{}
		if v.Medium == runtime.MediumMemory {
			ed.Medium = corev1.StorageMediumMemory
		}
		if v.SizeBytes > 0 {
			ed.SizeLimit = resource.NewQuantity(v.SizeBytes, resource.BinarySI)
		}
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: ed}})
	}
	for _, m := range spec.VolumeMounts {
		mounts = append(mounts, corev1.VolumeMount{Name: index[m.Volume], MountPath: m.Path, ReadOnly: m.ReadOnly, SubPath: m.SubPath})
	}
	if spec.Security != nil && spec.Security.ReadOnlyRootFS {
		for i, p := range runtime.ReadOnlyWritablePaths {
			if slices.ContainsFunc(spec.VolumeMounts, func(m runtime.VolumeMount) bool { return m.Path == p }) {
				continue
			}
			name := "writable-" + strconv.Itoa(i)
			vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(readOnlyTmpBytes, resource.BinarySI),
			}}})
			mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: p})
		}
	}
	return vols, mounts
}

// imageUserNeeded reports whether securityFor needs the image's USER: a run-as group
// without a run-as user keeps the image's user.
func imageUserNeeded(sec *runtime.Security) bool {
	return sec != nil && sec.RunAsUser == nil && sec.RunAsGroup != nil
}

func errImageUser(ref string, err error) error {
	return fmt.Errorf("image %s: user (for run_as_group): %w", ref, err)
}
