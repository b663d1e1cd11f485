package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	publicspec "github.com/sandboxd/sandboxd/internal/spec"
)

// TestGlobalVolumeSupport: the Kubernetes backend mounts GLOBAL volumes (its filler
// fills the copy from the snapshot cache, so none without one), commits writers
// (globalwriter_test.go) and takes sub_path mounts of them (globalsubpath_test.go).
func TestGlobalVolumeSupport(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} { // with and without a snapshot cache
		b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", SnapshotCacheDir: dir}, sandboxes: map[string]*sandbox{}}
		s := b.Support()
		if s.NoGlobalVolumes != (dir == "") || s.NoGlobalVolumeWriters || s.NoGlobalVolumeSubPaths {
			t.Errorf("snapshot cache %q: NoGlobalVolumes %v, NoGlobalVolumeWriters %v, NoGlobalVolumeSubPaths %v; want %v, false, false",
				dir, s.NoGlobalVolumes, s.NoGlobalVolumeWriters, s.NoGlobalVolumeSubPaths, dir == "")
		}
	}
}

// globalSpec mounts GLOBAL copy "g" (restored from digest d) read-only in the primary,
// beside an ordinary scratch volume.
func globalSpec(d string) *runtime.Spec {
	return &runtime.Spec{ID: "abc", Container: runtime.Container{Name: "main", Image: "busybox", Command: "sh",
		VolumeMounts: []runtime.VolumeMount{{Volume: "s", Path: "/scratch"}, {Volume: "g", Path: "/data", ReadOnly: true}}},
		Volumes: []runtime.Volume{{Name: "s", SizeBytes: 1 << 20}, {Name: "g", SizeBytes: 5 << 20, RestoreDigest: d,
			Global: &runtime.GlobalVolume{BlobPrefix: "volumes/x/g/", MaxSizeBytes: 5 << 20}}}}
}

func containerNamed(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

func mountAt(c *corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// checkFillerPod: the filler mounts the GLOBAL copy's emptyDir (and nothing of the
// workload's) writable, runs the agent image's agent from the bin emptyDir with its own
// config and run dir, which the gate reaches under ContainersDir; the workload's mount
// stays read-only.
func checkFillerPod(t *testing.T, what string, pod *corev1.Pod, workload string) {
	t.Helper()
	f := containerNamed(pod, containerFiller)
	if f == nil {
		t.Fatalf("%s: no filler container in %v", what, pod.Spec.Containers)
	}
	if f.Image != "agent:1" || strings.Join(f.Command, " ") != gate.GatePath+" exec-agent" {
		t.Errorf("%s: filler image %q, command %v", what, f.Image, f.Command)
	}
	var got []string
	for _, m := range f.VolumeMounts {
		got = append(got, m.Name+":"+m.MountPath+map[bool]string{true: ":ro", false: ""}[m.ReadOnly])
	}
	want := "bin:" + gate.BinDir + ":ro " + fillerVolRun + ":" + gate.RunDir + " " + fillerVolConfig + ":" + gate.ConfigDir + ":ro vol-1:/sandbox-volumes/1"
	if strings.Join(got, " ") != want {
		t.Errorf("%s: filler mounts %q, want %q", what, strings.Join(got, " "), want)
	}
	sc := f.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER"}) || sc.Privileged != nil ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: filler security context %v, want no escalation, only CHOWN DAC_OVERRIDE FOWNER, a read-only root", what, sc)
	}
	if m := mountAt(containerNamed(pod, containerGate), gate.ContainersDir+"/"+containerFiller); m == nil || m.Name != fillerVolRun {
		t.Errorf("%s: the gate does not reach the filler's run dir: %v", what, containerNamed(pod, containerGate).VolumeMounts)
	}
	if m := mountAt(containerNamed(pod, workload), "/data"); m == nil || m.Name != "vol-1" || !m.ReadOnly {
		t.Errorf("%s: workload's /data mount %v, want vol-1 read-only", what, m)
	}
	var cfg *corev1.Volume
	for i, v := range pod.Spec.Volumes {
		if v.Name == fillerVolConfig {
			cfg = &pod.Spec.Volumes[i]
		}
	}
	if cfg == nil || cfg.Secret == nil || len(cfg.Secret.Items) != 1 || cfg.Secret.Items[0].Key != fillerConfigKey || cfg.Secret.Items[0].Path != gate.ConfigFile {
		t.Errorf("%s: filler config volume %v", what, cfg)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != containerFiller && mountAt(&c, gate.ContainersDir+"/"+containerFiller) != nil && c.Name != containerGate {
			t.Errorf("%s: container %s mounts the filler's run dir", what, c.Name)
		}
	}
}

// TestGlobalVolumeFiller: a GLOBAL copy restored from a generation is filled through
// the runner-owned filler, not the workload (whose mount may be read-only): the restore
// plan names the filler and the copy's size bounds it; the Pod (one container or a
// group) has the filler; a GLOBAL copy without an archive (an empty volume) or a
// snapshot restore needs none; a spec container called like the filler is refused; the
// runner's callers cannot reach the filler's agent.
func TestGlobalVolumeFiller(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	b.cfg.ImageConfig = func(context.Context, string, *runtime.Credentials) (image.Config, error) { return image.Config{}, nil }
	d := digestOfBytes([]byte("x"))
	if err := os.MkdirAll(b.cfg.SnapshotCacheDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.cachePath(d), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := globalSpec(d)
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		t.Fatal(err)
	}
	plan, rel, err := b.planRestores(spec)
	rel()
	if err != nil || len(plan) != 1 || plan[0].container != containerFiller || plan[0].path != "/sandbox-volumes/1" || plan[0].limits.MaxBytes != 5<<20 {
		t.Fatalf("plan %+v, %v; want the filler's /sandbox-volumes/1, at most the copy's 5 MiB", plan, err)
	}

	// One container.
	sc, _ := securityFor(nil, "")
	pod := b.podFor(spec, "", b.labels(spec), nil, sc)
	b.addFiller(pod, spec)
	checkFillerPod(t, "single", pod, containerMain)
	if n := len(pod.Spec.Containers); n != 3 {
		t.Errorf("single: %d containers, want gate, sandbox, filler", n)
	}
	if n := sandboxContainers(pod); n != 1 {
		t.Errorf("single: %d containers counted as the sandbox's, want 1 (the filler is the runner's)", n)
	}

	// A group: the filler beside the sidecars; a sidecar may mount the copy writable too.
	gspec := globalSpec(d)
	gspec.Sidecars = []runtime.Container{{Name: "web", Image: "busybox", Command: "sh", VolumeMounts: []runtime.VolumeMount{{Volume: "g", Path: "/data"}}}}
	if err := runtime.ValidateSpec(gspec, maxIDLen); err != nil {
		t.Fatal(err)
	}
	plan, rel, err = b.planRestores(gspec)
	rel()
	if err != nil || len(plan) != 1 || plan[0].container != containerFiller {
		t.Errorf("group plan %+v, %v; want the filler", plan, err)
	}
	g, err := b.prepareGroup(context.Background(), gspec, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpod := b.podForGroup(gspec, g, "", b.labels(gspec), nil)
	b.addFiller(gpod, gspec)
	checkFillerPod(t, "group", gpod, containerMain)

	// No archive to restore (generation 0), or a snapshot restore: no filler.
	empty := globalSpec("")
	snap := globalSpec(d)
	snap.Volumes[1].Global = nil
	snap.Container.VolumeMounts[1].ReadOnly = false
	for name, sp := range map[string]*runtime.Spec{"empty generation": empty, "snapshot": snap} {
		p := b.podFor(sp, "", b.labels(sp), nil, sc)
		b.addFiller(p, sp)
		if containerNamed(p, containerFiller) != nil || needsFiller(sp) {
			t.Errorf("%s: a filler", name)
		}
	}
	plan, rel, err = b.planRestores(snap)
	rel()
	if err != nil || len(plan) != 1 || plan[0].container != "" || plan[0].path != "/data" {
		t.Errorf("snapshot plan %+v, %v; want the primary's /data", plan, err)
	}

	// The filler's name is reserved: by the public spec (every API path refuses a
	// container so named) and, as a backstop, here; a sidecar so named elsewhere is
	// renamed in the Pod.
	if !publicspec.ReservedContainerName(containerFiller) {
		t.Errorf("the filler's name %q is not one the public spec reserves", containerFiller)
	}
	clash := globalSpec(d)
	clash.Sidecars = []runtime.Container{{Name: containerFiller, Image: "busybox"}}
	if err := checkFiller(clash); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("a sidecar called %s: %v", containerFiller, err)
	}
	if ms := members(clash); ms[1].pod == containerFiller {
		t.Errorf("sidecar %s keeps the filler's Pod name", containerFiller)
	}

	// The filler's config: held in standby, with an identity of its own; its noop start.
	cfgJSON, ident, err := fillerConfig("abc")
	if err != nil {
		t.Fatal(err)
	}
	var cfg agentconfig.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil || !cfg.Standby || cfg.Identity == nil || cfg.Identity.ID != ident.ID || ident.ID != "abc/"+containerFiller || len(cfg.Argv) != 0 {
		t.Errorf("filler config %+v (%v)", cfg, err)
	}
	var noop agentconfig.Config
	if err := json.Unmarshal(fillerNoop, &noop); err != nil || strings.Join(noop.Argv, " ") != gate.GatePath+" noop" || noop.RestartLimit != 0 {
		t.Errorf("filler start %+v (%v)", noop, err)
	}

	// DialAgent (the runner's exec, files, logs) never reaches the filler.
	for _, sp := range []*runtime.Spec{spec, gspec} {
		b.sandboxes["abc"] = &sandbox{id: "abc", spec: *sp, done: make(chan struct{}), idents: map[string]*agentconfig.Identity{containerFiller: ident}}
		if _, err := b.DialAgent(context.Background(), "abc", containerFiller); !errors.Is(err, runtime.ErrContainerNotFound) {
			t.Errorf("multi %v: DialAgent to the filler: %v, want ErrContainerNotFound", sp.Multi(), err)
		}
	}
}

// podEphemeralLimit is the Pod's ephemeral-storage limit as the kubelet's eviction sums
// it (its containers' limits; ok false when none has one).
func podEphemeralLimit(pod *corev1.Pod) (int64, bool) {
	var sum int64
	ok := false
	for _, c := range pod.Spec.Containers {
		if q, has := c.Resources.Limits[corev1.ResourceEphemeralStorage]; has {
			sum, ok = sum+q.Value(), true
		}
	}
	return sum, ok
}

// TestGlobalVolumeFillerDisk: a filled GLOBAL copy's size (its emptyDir's sizeLimit,
// which the kubelet counts toward the Pod's ephemeral storage) is added to the Pod's
// ephemeral-storage limit, on the filler (a cap, request 0), so a full copy does not get
// the Pod evicted, while the primary keeps its disk as its own limit; one container and a
// group alike. A Pod without a disk limit gets none from the filler either.
func TestGlobalVolumeFillerDisk(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	b.cfg.ImageConfig = func(context.Context, string, *runtime.Credentials) (image.Config, error) { return image.Config{}, nil }
	const disk = 1 << 30
	d := digestOfBytes([]byte("x"))
	sc, _ := securityFor(nil, "")
	pods := func(t *testing.T) map[string]*corev1.Pod {
		t.Helper()
		spec := globalSpec(d)
		pod := b.podFor(spec, "", b.labels(spec), nil, sc)
		b.addFiller(pod, spec)
		gspec := globalSpec(d)
		gspec.Sidecars = []runtime.Container{{Name: "web", Image: "busybox", Command: "sh"}}
		g, err := b.prepareGroup(context.Background(), gspec, nil)
		if err != nil {
			t.Fatal(err)
		}
		gpod := b.podForGroup(gspec, g, "", b.labels(gspec), nil)
		b.addFiller(gpod, gspec)
		return map[string]*corev1.Pod{"single": pod, "group": gpod}
	}

	b.cfg.DiskBytes = disk
	for name, pod := range pods(t) {
		if got, ok := podEphemeralLimit(pod); !ok || got != disk+5<<20 {
			t.Errorf("%s: Pod ephemeral-storage limit %d (%v), want the disk and the 5 MiB copy, %d", name, got, ok, disk+5<<20)
		}
		if q := containerNamed(pod, containerMain).Resources.Limits[corev1.ResourceEphemeralStorage]; q.Value() != disk {
			t.Errorf("%s: the primary's limit %s, want its disk %d", name, q.String(), disk)
		}
		f := containerNamed(pod, containerFiller)
		if q, ok := f.Resources.Requests[corev1.ResourceEphemeralStorage]; !ok || !q.IsZero() {
			t.Errorf("%s: the filler's ephemeral-storage request %s (%v), want an explicit 0", name, q.String(), ok)
		}
	}

	b.cfg.DiskBytes = 0
	for name, pod := range pods(t) {
		if got, ok := podEphemeralLimit(pod); ok {
			t.Errorf("%s without a disk: Pod ephemeral-storage limit %d, want none", name, got)
		}
	}
}
