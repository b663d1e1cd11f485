package kubernetes

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// madePods runs one Create of spec against a fake API server and returns the Pods it made
// (the create itself never finishes: no kubelet).
func madePods(t *testing.T, spec *runtime.Spec) []*corev1.Pod {
	t.Helper()
	return madePodsCfg(t, Config{StartTimeout: time.Second, MaxPrepull: -1}, spec)
}

// madePodsCfg is madePods on a backend of cfg.
func madePodsCfg(t *testing.T, cfg Config, spec *runtime.Spec) []*corev1.Pod {
	t.Helper()
	b, cs := newFakeBackend(t, cfg)
	var mu sync.Mutex
	var made []*corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		if p, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); ok {
			mu.Lock()
			made = append(made, p.DeepCopy())
			mu.Unlock()
		}
		return false, nil, nil
	})
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ccancel()
	_, _ = b.Create(cctx, spec)
	mu.Lock()
	defer mu.Unlock()
	if len(made) == 0 {
		t.Fatal("the Create made no Pod")
	}
	return made
}

// gvisorHints returns a Pod's dev.gvisor.spec.mount.* annotations.
func gvisorHints(p *corev1.Pod) map[string]string {
	h := map[string]string{}
	for k, v := range p.Annotations {
		if strings.HasPrefix(k, gvisorMountAnnotation) {
			h[k] = v
		}
	}
	return h
}

// TestGVisorPodHints: a gvisor-class Pod marks the emptyDirs carrying agents' sockets (the
// gate's run dir; a group's per-container run dirs) as Pod-shared tmpfs for gVisor's shim —
// without it the gate never reaches the agent (test/k8s TestGVisorRuntimeClass) — and
// nothing else (a disk scratch volume stays host-backed); a runc Pod carries no hint. The
// gate's bin dir (in the sentry's memory, so a checkpoint holds the binaries: test/k8s
// TestK8sPauseResume) is a tmpfs only for a pausable spec on a runner with node agents,
// and then the gate container asks for gvisorBinBytes more memory.
func TestGVisorPodHints(t *testing.T) {
	sleep := runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"60"}}
	run := map[string]string{
		"dev.gvisor.spec.mount.run.share": "pod", "dev.gvisor.spec.mount.run.type": "tmpfs",
		"dev.gvisor.spec.mount.run.options": "rw,rprivate",
	}
	withBin := maps.Clone(run)
	maps.Copy(withBin, map[string]string{
		"dev.gvisor.spec.mount.bin.share": "pod", "dev.gvisor.spec.mount.bin.type": "tmpfs",
		"dev.gvisor.spec.mount.bin.options": "rw,rprivate",
	})
	gateMem := func(p *corev1.Pod) (req, lim int64) {
		for _, c := range p.Spec.Containers {
			if c.Name == containerGate {
				return c.Resources.Requests.Memory().Value(), c.Resources.Limits.Memory().Value()
			}
		}
		t.Fatal("no gate container")
		return 0, 0
	}
	agentsCfg := Config{StartTimeout: time.Second, MaxPrepull: -1, NodeAgents: &fakeNodeAgent{},
		RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}}

	// Pausable, node agents: bin dir a tmpfs, the gate's memory grown.
	plain := &runtime.Spec{ID: "gv-0", Container: sleep, RuntimeClass: GVisorClass}
	p := madePodsCfg(t, agentsCfg, plain)[0]
	if got := gvisorHints(p); !maps.Equal(got, withBin) {
		t.Errorf("pausable gVisor Pod with node agents: hints %v, want %v", got, withBin)
	}
	req, lim := gateMem(p)
	// Without node agents: no bin hint, the gate's memory as before.
	p0 := madePods(t, plain)[0]
	if got := gvisorHints(p0); !maps.Equal(got, run) {
		t.Errorf("gVisor Pod without node agents: hints %v, want %v", got, run)
	}
	req0, lim0 := gateMem(p0)
	if req-req0 != gvisorBinBytes || lim-lim0 != gvisorBinBytes {
		t.Errorf("gate memory request/limit %d/%d with the bin tmpfs, %d/%d without: want %d more", req, lim, req0, lim0, gvisorBinBytes)
	}

	// Refused spec (a scratch volume), node agents: no bin hint.
	single := &runtime.Spec{ID: "gv-1", Container: sleep, RuntimeClass: GVisorClass,
		Volumes: []runtime.Volume{{Name: "scratch", Medium: runtime.MediumDisk}}}
	single.VolumeMounts = []runtime.VolumeMount{{Volume: "scratch", Path: "/scratch"}}
	p = madePodsCfg(t, agentsCfg, single)[0]
	if got := gvisorHints(p); !maps.Equal(got, run) {
		t.Errorf("unpausable gVisor Pod (scratch volume): hints %v, want %v", got, run)
	}
	if r, l := gateMem(p); r != req0 || l != lim0 {
		t.Errorf("unpausable gVisor Pod: gate memory %d/%d, want %d/%d", r, l, req0, lim0)
	}

	group := single.Clone()
	group.ID = "gv-2"
	group.Name = "app"
	group.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"60"}}}
	p = madePodsCfg(t, agentsCfg, &group)[0]
	got := gvisorHints(p)
	runs := 0
	for _, v := range p.Spec.Volumes {
		if strings.HasPrefix(v.Name, "run-") {
			runs++
			if got[gvisorMountAnnotation+v.Name+".share"] != "pod" || got[gvisorMountAnnotation+v.Name+".type"] != "tmpfs" {
				t.Errorf("group Pod: run dir %s not hinted: %v", v.Name, got)
			}
		}
	}
	if runs < 2 || len(got) != 3*runs {
		t.Errorf("group Pod (not pausable): %d run dirs, hints %v (want exactly theirs, no bin)", runs, got)
	}

	runc := single.Clone()
	runc.ID = "rc-1"
	runc.RuntimeClass = ""
	if got := gvisorHints(madePods(t, &runc)[0]); len(got) != 0 {
		t.Errorf("runc Pod carries gVisor hints %v", got)
	}
}

// TestRuntimeClassesConfig: the configured classes are offered default first, the rest in
// name order; none configured offers nothing (the runner's default, runc); a map without
// the default class or with a bad name is refused by New.
func TestRuntimeClassesConfig(t *testing.T) {
	newB := func(m map[string]string) (*Backend, error) {
		return New(t.Context(), Config{Client: fake.NewClientset(), Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
			MaxPrepull: -1, RuntimeClasses: m})
	}
	b, err := newB(map[string]string{"runc": "", "gvisor": "gvisor", "kata": "kata-qemu"})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.RuntimeClasses(); strings.Join(got, ",") != "runc,gvisor,kata" {
		t.Errorf("classes %v, want runc first, then gvisor, kata", got)
	}
	b.Close()
	if b, err = newB(nil); err != nil {
		t.Fatal(err)
	}
	if got := b.RuntimeClasses(); got != nil {
		t.Errorf("no classes configured: %v, want nil", got)
	}
	b.Close()
	for _, m := range []map[string]string{
		{"gvisor": "gvisor"},              // no default
		{"runc": "", "GVisor": "gvisor"},  // class not a DNS label
		{"runc": "", "gvisor": "g_visor"}, // RuntimeClass not a DNS subdomain
	} {
		if b, err := newB(m); err == nil {
			b.Close()
			t.Errorf("New took RuntimeClasses %v", m)
		}
	}
}
