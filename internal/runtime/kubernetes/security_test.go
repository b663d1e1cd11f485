package kubernetes

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func describeSC(sc *corev1.SecurityContext) string {
	if sc == nil {
		return "nil"
	}
	var parts []string
	if sc.RunAsUser != nil {
		parts = append(parts, fmt.Sprintf("uid=%d", *sc.RunAsUser))
	}
	if sc.RunAsGroup != nil {
		parts = append(parts, fmt.Sprintf("gid=%d", *sc.RunAsGroup))
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		parts = append(parts, "ro")
	}
	if sc.AllowPrivilegeEscalation != nil {
		parts = append(parts, fmt.Sprintf("ape=%v", *sc.AllowPrivilegeEscalation))
	}
	if c := sc.Capabilities; c != nil {
		parts = append(parts, fmt.Sprintf("drop=%v add=%v", c.Drop, c.Add))
	}
	if sc.SeccompProfile != nil {
		parts = append(parts, "seccomp="+string(sc.SeccompProfile.Type))
	}
	if sc.Privileged != nil {
		parts = append(parts, "privileged")
	}
	return strings.Join(parts, " ")
}

func TestSecurityFor(t *testing.T) {
	u1000, g0, g50 := uint32(1000), uint32(0), uint32(50)
	for _, tc := range []struct {
		name      string
		sec       *runtime.Security
		imageUser string
		want      string
		wantUser  string
	}{
		{"none", nil, "", "seccomp=RuntimeDefault", ""},
		{"zero value", &runtime.Security{}, "app", "seccomp=RuntimeDefault", ""},
		{"seccomp only", &runtime.Security{SeccompProfile: runtime.SeccompRuntimeDefault}, "", "seccomp=RuntimeDefault", ""},
		// The agent stays root and starts commands as the user (local backend's model).
		{"run as user", &runtime.Security{RunAsUser: &u1000}, "", "uid=0 gid=0 ape=false seccomp=RuntimeDefault", "1000"},
		{"run as user and group", &runtime.Security{RunAsUser: &u1000, RunAsGroup: &g50}, "", "uid=0 gid=0 ape=false seccomp=RuntimeDefault", "1000:50"},
		{"group keeps the image's user", &runtime.Security{RunAsGroup: &g50}, "app", "uid=0 gid=0 ape=false seccomp=RuntimeDefault", "app:50"},
		{"root user", &runtime.Security{RunAsUser: new(uint32), RunAsGroup: &g0, CapDrop: []string{"ALL"}}, "",
			"uid=0 gid=0 ape=false drop=[ALL] add=[] seccomp=RuntimeDefault", "0:0"},
		{"read-only root, drop ALL, non-root: the agent keeps what it needs",
			&runtime.Security{RunAsUser: &u1000, ReadOnlyRootFS: true, CapDrop: []string{"ALL"}}, "",
			"uid=0 gid=0 ro ape=false drop=[ALL] add=[CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID] seccomp=RuntimeDefault", "1000"},
		{"drops and adds as root", &runtime.Security{CapDrop: []string{"CAP_NET_RAW", "CAP_MKNOD"}, CapAdd: []string{"CAP_NET_ADMIN"}}, "",
			"ape=false drop=[NET_RAW MKNOD] add=[NET_ADMIN] seccomp=RuntimeDefault", ""},
		{"an add already among the agent's is not repeated", &runtime.Security{RunAsUser: &u1000, CapDrop: []string{"ALL"}, CapAdd: []string{"CAP_KILL"}}, "",
			"uid=0 gid=0 ape=false drop=[ALL] add=[KILL CHOWN DAC_OVERRIDE FOWNER SETGID SETUID] seccomp=RuntimeDefault", "1000"},
		{"privilege escalation", &runtime.Security{AllowPrivilegeEscalation: true}, "", "ape=true seccomp=RuntimeDefault", ""},
		{"read-only root alone", &runtime.Security{ReadOnlyRootFS: true}, "", "ro ape=false seccomp=RuntimeDefault", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, user := securityFor(tc.sec, tc.imageUser)
			if got := describeSC(sc); got != tc.want || user != tc.wantUser {
				t.Errorf("securityFor = %q, user %q; want %q, user %q", got, user, tc.want, tc.wantUser)
			}
		})
	}
}

func describeVolumes(vols []corev1.Volume, mounts []corev1.VolumeMount) string {
	var parts []string
	for _, v := range vols {
		ed := v.EmptyDir
		s := v.Name + ":" + string(ed.Medium)
		if ed.SizeLimit != nil {
			s += "/" + ed.SizeLimit.String()
		}
		parts = append(parts, s)
	}
	for _, m := range mounts {
		s := m.Name + "@" + m.MountPath
		if m.SubPath != "" {
			s += "[" + m.SubPath + "]"
		}
		if m.ReadOnly {
			s += ":ro"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func TestVolumesFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want string
	}{
		{"none", runtime.Spec{}, ""},
		{"both media, sizes, sub_path, read-only, one volume at two paths", runtime.Spec{
			Volumes: []runtime.Volume{{Name: "Scratch_1", SizeBytes: 64 << 20}, {Name: "mem", SizeBytes: 32 << 20, Medium: runtime.MediumMemory}, {Name: "free"}},
			Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "Scratch_1", Path: "/data"}, {Volume: "Scratch_1", Path: "/view", ReadOnly: true, SubPath: "a/b"},
				{Volume: "mem", Path: "/fast"}, {Volume: "free", Path: "/free"}}},
		}, "vol-0:/64Mi vol-1:Memory/32Mi vol-2: vol-0@/data vol-0@/view[a/b]:ro vol-1@/fast vol-2@/free"},
		{"memory without a size: bounded by the Pod's memory", runtime.Spec{
			Volumes: []runtime.Volume{{Name: "m", Medium: runtime.MediumMemory}}, Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "m", Path: "/m"}}},
		}, "vol-0:Memory vol-0@/m"},
		{"read-only root: writable paths", runtime.Spec{Container: runtime.Container{Security: &runtime.Security{ReadOnlyRootFS: true}}},
			"writable-0:Memory/256Mi writable-1:Memory/256Mi writable-2:Memory/256Mi writable-0@/tmp writable-1@/var/tmp writable-2@/run"},
		{"read-only root: a volume at /tmp replaces its emptyDir", runtime.Spec{
			Container: runtime.Container{Security: &runtime.Security{ReadOnlyRootFS: true}, VolumeMounts: []runtime.VolumeMount{{Volume: "t", Path: "/tmp"}}},
			Volumes:   []runtime.Volume{{Name: "t", SizeBytes: 1 << 30}},
		}, "vol-0:/1Gi writable-1:Memory/256Mi writable-2:Memory/256Mi vol-0@/tmp writable-1@/var/tmp writable-2@/run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeVolumes(volumesFor(&tc.spec)); got != tc.want {
				t.Errorf("volumesFor =\n  %s\nwant\n  %s", got, tc.want)
			}
		})
	}
}

// TestPodForSecurityAndVolumes: the translations land on the main container only; the
// gate keeps its own mounts and its restricted context.
func TestPodForSecurityAndVolumes(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", TerminationGrace: 10e9}}
	u := uint32(1000)
	spec := &runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", Security: &runtime.Security{RunAsUser: &u, ReadOnlyRootFS: true, CapDrop: []string{"ALL"}}, VolumeMounts: []runtime.VolumeMount{{Volume: "d", Path: "/data"}}},
		Volumes: []runtime.Volume{{Name: "d", SizeBytes: 1 << 20}}}
	sc, _ := securityFor(spec.Security, "")
	pod := b.podFor(spec, "", b.labels(spec), nil, sc)
	gate, main := pod.Spec.Containers[0], pod.Spec.Containers[1]
	if describeSC(gate.SecurityContext) != restrictedGate || len(gate.VolumeMounts) != 3 {
		t.Errorf("gate: context %v, mounts %v", gate.SecurityContext, gate.VolumeMounts)
	}
	if main.SecurityContext != sc {
		t.Errorf("main container context %v", main.SecurityContext)
	}
	var got []string
	for _, m := range main.VolumeMounts {
		got = append(got, m.MountPath)
	}
	// The agent's own paths come first and stay: bin (read-only), run and config.
	if want := "/.sandboxd/bin /.sandboxd/run /.sandboxd/config /data /tmp /var/tmp /run"; strings.Join(got, " ") != want {
		t.Errorf("main mounts %q, want %q", strings.Join(got, " "), want)
	}
	if len(pod.Spec.Volumes) != 4+1+3 {
		t.Errorf("pod volumes %d", len(pod.Spec.Volumes))
	}
}

const restrictedGate = "uid=65532 gid=65532 ro ape=false drop=[ALL] add=[] seccomp=RuntimeDefault"

// TestContainerContexts: whatever the spec asks for, the gate runs with what the Pod
// Security Standard "restricted" asks of a container (runAsNonRoot with a non-root uid,
// no privilege escalation, every capability dropped, RuntimeDefault seccomp), the Pod
// has no other helper container, and its TLS Secret is readable by that uid; the main
// container's context is securityFor's, untouched.
func TestContainerContexts(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", TerminationGrace: 10e9}}
	u := uint32(1000)
	for _, sec := range []*runtime.Security{
		nil,
		{RunAsUser: &u, ReadOnlyRootFS: true, CapDrop: []string{"ALL"}},
		{AllowPrivilegeEscalation: true, CapAdd: []string{"NET_ADMIN"}},
	} {
		spec := &runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", Security: sec}}
		sc, _ := securityFor(sec, "")
		pod := b.podFor(spec, "", b.labels(spec), nil, sc)
		if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Containers) != 2 {
			t.Fatalf("%+v: init containers %d, containers %d", sec, len(pod.Spec.InitContainers), len(pod.Spec.Containers))
		}
		g, main := pod.Spec.Containers[0], pod.Spec.Containers[1]
		gsc := g.SecurityContext
		if got := describeSC(gsc); got != restrictedGate {
			t.Errorf("%+v: gate context %q, want %q", sec, got, restrictedGate)
		}
		if gsc == nil || gsc.RunAsNonRoot == nil || !*gsc.RunAsNonRoot || gsc.Privileged != nil {
			t.Errorf("%+v: gate context without runAsNonRoot: %+v", sec, gsc)
		}
		if main.SecurityContext != sc {
			t.Errorf("%+v: main context %s, want securityFor's %s", sec, describeSC(main.SecurityContext), describeSC(sc))
		}
		if pod.Spec.SecurityContext != nil {
			t.Errorf("%+v: pod-level context %+v (it would apply to the main container too)", sec, pod.Spec.SecurityContext)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == "tls" && (v.Secret == nil || *v.Secret.DefaultMode&0o004 == 0) {
				t.Errorf("%+v: the gate's Secret is not readable by its non-root user: %+v", sec, v.Secret)
			}
		}
	}
}

// TestPolicyReservedAnnotationsDropped: a policy stored before the policy check refused
// the reserved prefix may still hold sandboxd.io/ keys: none reaches the Pod (a forged
// sandboxd.io/warm-claimed would make Recover take a Pod for a warm claim; a forged
// workload-started, a GLOBAL writer's workload for started); other keys do.
func TestPolicyReservedAnnotationsDropped(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage = "ns", "r1", "agent:1"
	spec := &runtime.Spec{ID: "x", Container: runtime.Container{Image: "busybox", Command: "sh"},
		Pod: &runtime.PodSettings{Annotations: map[string]string{
			annotationWarmClaimed:     "2020-01-01T00:00:00Z",
			annotationWorkloadStarted: "true",
			"sandboxd.io/other":       "x",
			"example.com/team":        "a",
		}}}
	sc, _ := securityFor(nil, "")
	pod := b.podFor(spec, "", b.labels(spec), nil, sc)
	for k := range pod.Annotations {
		if strings.HasPrefix(k, runtime.ReservedPodAnnotationPrefix) {
			t.Errorf("the policy's reserved annotation %q reached the Pod", k)
		}
	}
	if pod.Annotations["example.com/team"] != "a" {
		t.Errorf("annotations %v: the policy's own key is missing", pod.Annotations)
	}
	if _, ok := warmClaimedAt(pod); ok || warmClaimBegun(pod) {
		t.Error("the Pod reads as claimed from the warm pool")
	}
}
