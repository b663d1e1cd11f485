package kubernetes

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

func groupSpec() *runtime.Spec {
	uid := uint32(1000)
	return &runtime.Spec{
		ID: "grp1",
		Container: runtime.Container{
			Name: "app", Image: "app:1", Command: "/bin/app", Args: []string{"serve"},
			Env:          map[string]string{"ROLE": "app"},
			WorkingDir:   "/srv",
			Files:        []runtime.File{{Path: "/etc/app.conf", Content: []byte("x"), Mode: 0o644}},
			Resources:    runtime.Resources{MilliCPU: 1000, MemoryBytes: 512 << 20},
			VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}},
			RestartLimit: 2,
		},
		Sidecars: []runtime.Container{
			{Name: "redis", Image: "redis:7", Command: "redis-server", Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, RequestMilliCPU: 100},
				VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/var/lib/redis", ReadOnly: true}},
				Tmpfs:        []string{"/tmp"}, RestartLimit: 3,
				Security: &runtime.Security{RunAsUser: &uid, ReadOnlyRootFS: true}},
			{Name: "gate", Image: "busybox", Command: "sleep", Args: []string{"inf"}},
		},
		InitContainers: []runtime.Container{
			{Name: "migrate", Image: "app:1", Command: "/bin/migrate", Env: map[string]string{"STEP": "1"}},
		},
		Volumes:     []runtime.Volume{{Name: "data"}},
		HostAliases: []string{"redis", "db"},
	}
}

// TestPodForGroup: a group is one Pod: the install init container then the spec's init
// containers, the gate, the primary as `sandbox`, the sidecars (a reserved name
// prefixed), each with its own image, agent config from the Secret, run dir, resources,
// security context, shared volume mounts and tmpfs; the gate reaches every non-init
// agent; host aliases resolve to 127.0.0.1.
func TestPodForGroup(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", ImagePullPolicy: corev1.PullNever, TerminationGrace: 10e9,
		ImageConfig: func(context.Context, string, *runtime.Credentials) (image.Config, error) { return image.Config{}, nil }}}
	spec := groupSpec()
	if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
		t.Fatal(err)
	}
	g, err := b.prepareGroup(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := b.podForGroup(spec, g, "", b.labels(spec), nil)

	var inits, ctrs []string
	for _, c := range pod.Spec.InitContainers {
		inits = append(inits, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		ctrs = append(ctrs, c.Name)
	}
	if got := strings.Join(inits, ","); got != "install,migrate" {
		t.Errorf("init containers %s", got)
	}
	if got := strings.Join(ctrs, ","); got != "gate,sandbox,redis,c3-gate" {
		t.Errorf("containers %s", got)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy %s", pod.Spec.RestartPolicy)
	}
	if len(pod.Spec.HostAliases) != 1 || pod.Spec.HostAliases[0].IP != "127.0.0.1" || strings.Join(pod.Spec.HostAliases[0].Hostnames, ",") != "redis,db" {
		t.Errorf("host aliases %+v", pod.Spec.HostAliases)
	}
	byName := map[string]*corev1.Container{}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			byName[list[i].Name] = &list[i]
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		if _, dup := vols[v.Name]; dup {
			t.Errorf("volume %s twice", v.Name)
		}
		vols[v.Name] = v
	}
	mount := func(c *corev1.Container, path string) *corev1.VolumeMount {
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == path {
				return &c.VolumeMounts[i]
			}
		}
		return nil
	}
	// Each container: its image, the agent as entrypoint, its own config key and run dir.
	seenRun := map[string]bool{}
	// Only sidecars' agents leave their final status in the termination message.
	for _, tc := range []struct {
		pod, image, key string
		termLog         bool
	}{
		{"migrate", "app:1", "config-migrate.json", false},
		{"sandbox", "app:1", gate.ConfigFile, false},
		{"redis", "redis:7", "config-redis.json", true},
		{"c3-gate", "busybox", "config-gate.json", true},
	} {
		c := byName[tc.pod]
		if c == nil {
			t.Fatalf("no container %s", tc.pod)
		}
		want := []string{gate.GatePath, "exec-agent"}
		if tc.termLog {
			want = append(want, gate.FlagTerminationLog)
		}
		if c.Image != tc.image || !slices.Equal(c.Command, want) {
			t.Errorf("%s: image %s command %v", tc.pod, c.Image, c.Command)
		}
		cm := mount(c, gate.ConfigDir)
		if cm == nil || !cm.ReadOnly {
			t.Fatalf("%s: config mount %+v", tc.pod, cm)
		}
		if items := vols[cm.Name].Secret.Items; len(items) != 1 || items[0].Key != tc.key || items[0].Path != gate.ConfigFile {
			t.Errorf("%s: config items %+v", tc.pod, items)
		}
		rm := mount(c, gate.RunDir)
		if rm == nil || seenRun[rm.Name] || vols[rm.Name].EmptyDir == nil {
			t.Errorf("%s: run dir %+v (shared or not an emptyDir)", tc.pod, rm)
		} else {
			seenRun[rm.Name] = true
		}
		if bm := mount(c, gate.BinDir); bm == nil || !bm.ReadOnly {
			t.Errorf("%s: bin mount %+v", tc.pod, bm)
		}
	}
	// The gate reaches the primary at RunDir and every non-init container by name.
	gc := byName["gate"]
	for path, pod := range map[string]string{gate.RunDir: "sandbox", gate.ContainersDir + "/app": "sandbox", gate.ContainersDir + "/redis": "redis", gate.ContainersDir + "/gate": "c3-gate"} {
		gm, cm := mount(gc, path), mount(byName[pod], gate.RunDir)
		if gm == nil || cm == nil || gm.Name != cm.Name {
			t.Errorf("gate mount %s: %+v, want %s's run dir", path, gm, pod)
		}
	}
	if mount(gc, gate.ContainersDir+"/migrate") != nil {
		t.Error("the gate mounts an init container's run dir")
	}
	// Shared volume: one emptyDir mounted in app and (read-only) in redis.
	am, rm := mount(byName["sandbox"], "/data"), mount(byName["redis"], "/var/lib/redis")
	if am == nil || rm == nil || am.Name != rm.Name || !rm.ReadOnly || am.ReadOnly || vols[am.Name].EmptyDir == nil {
		t.Errorf("shared volume mounts %+v %+v", am, rm)
	}
	// Tmpfs: redis' own memory emptyDir.
	if tm := mount(byName["redis"], "/tmp"); tm == nil || vols[tm.Name].EmptyDir == nil || vols[tm.Name].EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("tmpfs mount %+v", tm)
	} else if mount(byName["sandbox"], "/tmp") != nil {
		t.Error("the primary got redis' tmpfs")
	}
	// Resources per container (the kubelet sums them for the Pod).
	if q := byName["sandbox"].Resources.Limits[corev1.ResourceCPU]; q.MilliValue() != 1000 {
		t.Errorf("app cpu limit %s", q.String())
	}
	if q := byName["redis"].Resources.Limits[corev1.ResourceMemory]; q.Value() != 256<<20 {
		t.Errorf("redis memory limit %s", q.String())
	}
	if q := byName["redis"].Resources.Requests[corev1.ResourceCPU]; q.MilliValue() != 100 {
		t.Errorf("redis cpu request %s", q.String())
	}
	// Security per container: redis runs its command as 1000 under a read-only root.
	if sc := byName["redis"].SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("redis security context %+v", sc)
	}
	if sc := byName["sandbox"].SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem != nil {
		t.Errorf("app security context %+v", sc)
	}
	if byName["sandbox"].WorkingDir != "/srv" {
		t.Errorf("app working dir %q", byName["sandbox"].WorkingDir)
	}
	if ic := byName["install"]; !slices.Equal(ic.Command, []string{"/sandbox-gate", "install"}) || ic.Image != "agent:1" {
		t.Errorf("install container %+v", ic)
	}

	// Agent configs: the init container's is complete and never restarts; the others are
	// held (standby) and get their config at Start; every identity differs.
	var initCfg, appCfg, redisStart agentconfig.Config
	mustJSON(t, g.secret["config-migrate.json"], &initCfg)
	mustJSON(t, g.secret[gate.ConfigFile], &appCfg)
	mustJSON(t, g.start["redis"], &redisStart)
	if initCfg.Standby || !slices.Equal(initCfg.Argv, []string{"/bin/migrate"}) || !slices.Contains(initCfg.Env, "STEP=1") || initCfg.RestartLimit != 0 {
		t.Errorf("init config %+v", initCfg)
	}
	if !appCfg.Standby || len(appCfg.Argv) != 0 || appCfg.Identity == nil || appCfg.Identity.ID != "grp1" {
		t.Errorf("primary's held config %+v", appCfg)
	}
	if !slices.Equal(redisStart.Argv, []string{"redis-server"}) || redisStart.RestartLimit != 3 || redisStart.User != "1000" {
		t.Errorf("redis start config %+v", redisStart)
	}
	var appStart agentconfig.Config
	mustJSON(t, g.start["app"], &appStart)
	if len(appStart.Files) != 1 || appStart.WorkingDir != "/srv" || !slices.Contains(appStart.Env, "ROLE=app") {
		t.Errorf("app start config %+v", appStart)
	}
	ids := map[string]bool{}
	for name, id := range g.idents {
		if id == nil || ids[id.Secret] {
			t.Errorf("identity of %s: %+v", name, id)
		} else {
			ids[id.Secret] = true
		}
	}
	if len(ids) != 4 || g.idents["redis"].ID != "grp1/redis" {
		t.Errorf("identities %+v", g.idents)
	}
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
}

// Pod names: reserved names and names of the prefixed form are prefixed with their index,
// so no two containers share a Pod name.
func TestMemberPodNames(t *testing.T) {
	spec := &runtime.Spec{ID: "x", Container: runtime.Container{Name: "gate", Image: "i"},
		Sidecars: []runtime.Container{{Name: "sandbox", Image: "i"}, {Name: "c2-sandbox", Image: "i"}, {Name: "install", Image: "i"}, {Name: strings.Repeat("a", 63), Image: "i"}}}
	var got []string
	for _, m := range members(spec) {
		got = append(got, m.pod)
	}
	want := []string{"sandbox", "c1-sandbox", "c2-c2-sandbox", "c3-install", strings.Repeat("a", 63)}
	if !slices.Equal(got, want) {
		t.Errorf("pod names %v, want %v", got, want)
	}
}

// The primary's end ends a group: its container or the gate terminated.
func TestPrimaryEnded(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	ended := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
	pod := func(gateS, mainS, sideS corev1.ContainerState) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: containerGate, State: gateS}, {Name: containerMain, State: mainS}, {Name: "redis", State: sideS}}}}
	}
	if primaryEnded(pod(running, running, ended)) {
		t.Error("a sidecar's end ended the group")
	}
	if !primaryEnded(pod(running, ended, running)) || !primaryEnded(pod(ended, running, running)) {
		t.Error("the primary's end did not end the group")
	}
}

// Each container's pull credentials go into the one pull Secret, for its own registry.
func TestDockerConfigSecretGroup(t *testing.T) {
	spec := &runtime.Spec{ID: "p1",
		Container: runtime.Container{Name: "app", Image: "reg.one/app:1", PullCredentials: &runtime.Credentials{Username: "u1", Password: "p1"}},
		Sidecars: []runtime.Container{
			{Name: "db", Image: "reg.two/db:1", PullCredentials: &runtime.Credentials{Username: "u2", Password: "p2"}},
			{Name: "pub", Image: "busybox"},
		}}
	sec, err := dockerConfigSecret(spec)
	if err != nil || sec == nil {
		t.Fatal(sec, err)
	}
	var cfg struct {
		Auths map[string]struct{ Username, Password string }
	}
	mustJSON(t, sec.Data[corev1.DockerConfigJsonKey], &cfg)
	if len(cfg.Auths) != 2 || cfg.Auths["reg.one"].Username != "u1" || cfg.Auths["reg.two"].Password != "p2" {
		t.Errorf("auths %+v", cfg.Auths)
	}
	if sec, err := dockerConfigSecret(&runtime.Spec{ID: "p2", Container: runtime.Container{Image: "busybox"}}); sec != nil || err != nil {
		t.Errorf("no credentials: %v, %v", sec, err)
	}
}
