package kubernetes

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func podWith(main, gateState corev1.ContainerState, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerGate, State: gateState}, {Name: containerMain, State: main, Image: "img"},
	}}}
}

// deleting marks p as being deleted.
func deleting(p *corev1.Pod) *corev1.Pod {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	return p
}

func TestExitOf(t *testing.T) {
	term := func(code int32, reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg}}
	}
	status := `{"state":"MAIN_STATE_FAILED","exitCode":3,"restartCount":2,"reason":"RestartLimit","message":"gave up"}`
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		deleted    bool
		reason     string
		code       string
		restarts   int
		msgContain string
	}{
		{"agent status wins", podWith(term(3, "Error", ""), term(0, "Completed", status), corev1.PodFailed), false, "RestartLimit", "3", 2, "gave up"},
		{"completed from the container", podWith(term(0, "Completed", ""), term(0, "Completed", ""), corev1.PodSucceeded), false, "Completed", "0", 0, ""},
		{"error from the container", podWith(term(1, "Error", ""), term(0, "Completed", ""), corev1.PodFailed), false, "Error", "1", 0, ""},
		{"oom", podWith(term(137, "OOMKilled", ""), term(0, "Completed", ""), corev1.PodFailed), false, "OOMKilled", "137", 0, ""},
		{"deleted while running", podWith(corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, corev1.ContainerState{}, corev1.PodRunning), true, "Killed", "nil", 0, "deleted"},
		{"never seen", nil, true, "Killed", "nil", 0, ""},
		{"killed when the grace period ran out", deleting(podWith(term(137, "Error", ""), term(0, "Completed", `{"state":"MAIN_STATE_RUNNING"}`), corev1.PodFailed)), false, "Killed", "nil", 0, "deleted"},
		{"oom while being deleted", deleting(podWith(term(137, "OOMKilled", ""), term(0, "Completed", ""), corev1.PodFailed)), false, "OOMKilled", "137", 0, ""},
		{"stopped while being deleted", deleting(podWith(term(0, "Completed", ""), term(0, "Completed", `{"state":"MAIN_STATE_STOPPED","exitCode":0,"reason":"Stopped"}`), corev1.PodSucceeded)), false, "Stopped", "0", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := exitOf(tc.pod, tc.deleted, 6, false)
			code := "nil"
			if ex.ExitCode != nil {
				code = strconv.Itoa(int(*ex.ExitCode))
			}
			if ex.Reason != tc.reason || code != tc.code || ex.Restarts != tc.restarts || !strings.Contains(ex.Message, tc.msgContain) {
				t.Errorf("exit = %+v (code %s), want reason %s code %s restarts %d message ~%q", ex, code, tc.reason, tc.code, tc.restarts, tc.msgContain)
			}
		})
	}
}

func TestStartError(t *testing.T) {
	wait := func(reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want error
	}{
		{"creating", podWith(wait("ContainerCreating", ""), running, corev1.PodPending), nil},
		{"never pull", podWith(wait("ErrImageNeverPull", "not present"), running, corev1.PodPending), runtime.ErrImageNotFound},
		{"not found", podWith(wait("ErrImagePull", "rpc error: failed to resolve reference: docker.io/x/y:1: not found"), running, corev1.PodPending), runtime.ErrImageNotFound},
		{"unauthorized", podWith(wait("ErrImagePull", "pull access denied, 401 Unauthorized"), running, corev1.PodPending), runtime.ErrImageUnauthorized},
		{"unreachable", podWith(wait("ImagePullBackOff", "dial tcp: i/o timeout"), running, corev1.PodPending), runtime.ErrRegistry},
		{"bad name", podWith(wait("InvalidImageName", "couldn't parse"), running, corev1.PodPending), runtime.ErrInvalidImageRef},
		{"config", podWith(wait("CreateContainerConfigError", "secret missing"), running, corev1.PodPending), runtime.ErrInvalidSpec},
		{"agent image", podWith(corev1.ContainerState{}, wait("ErrImageNeverPull", "agent"), corev1.PodPending), runtime.ErrImageNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := startError(tc.pod, nil)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("startError = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("startError = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPodFor(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", ImagePullPolicy: corev1.PullNever, TerminationGrace: 10e9}}
	spec := &runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", WorkingDir: "/w", Env: map[string]string{"SECRET": "x"}, Resources: runtime.Resources{MilliCPU: 250, MemoryBytes: 64 << 20}},
		Meta: map[string]string{runtime.MetaOrg: "org-9"}}
	pod := b.podFor(spec, "gvisor", b.labels(spec), nil, nil)
	if pod.Name != "sbx-abc" || pod.Labels[LabelOrg] != "org-9" || pod.Labels[LabelRunner] != "r1" || pod.Labels[LabelSandbox] != "abc" {
		t.Errorf("meta: %s %v", pod.Name, pod.Labels)
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName %v", pod.Spec.RuntimeClassName)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("restart policy %s, automount %v", pod.Spec.RestartPolicy, *pod.Spec.AutomountServiceAccountToken)
	}
	main := pod.Spec.Containers[1]
	if main.Name != containerMain || main.WorkingDir != "/w" || len(main.Env) != 0 {
		t.Errorf("main container %+v", main)
	}
	if main.Resources.Limits.Cpu().MilliValue() != 250 || main.Resources.Requests.Memory().Value() != 64<<20 {
		t.Errorf("resources %+v", main.Resources)
	}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == "tls" && c.Name != containerGate {
				t.Errorf("container %s mounts the gate's keys", c.Name)
			}
		}
	}
}

// TestPodForRequests: the Pod asks the scheduler for the sandbox's requests and is held
// to its limits; a limit alone is also the request.
func TestPodForRequests(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1"}}
	spec := &runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", Resources: runtime.Resources{
		RequestMilliCPU: 100, MilliCPU: 1000, RequestMemoryBytes: 128 << 20, MemoryBytes: 1 << 30}}}
	r := b.podFor(spec, "", b.labels(spec), nil, nil).Spec.Containers[1].Resources
	if r.Requests.Cpu().MilliValue() != 100 || r.Limits.Cpu().MilliValue() != 1000 ||
		r.Requests.Memory().Value() != 128<<20 || r.Limits.Memory().Value() != 1<<30 {
		t.Errorf("requests %v, limits %v; want 100m/128Mi requested, 1/1Gi limits", r.Requests, r.Limits)
	}
	spec.Resources = runtime.Resources{MilliCPU: 500}
	r = b.podFor(spec, "", b.labels(spec), nil, nil).Spec.Containers[1].Resources
	if r.Requests.Cpu().MilliValue() != 500 {
		t.Errorf("a lone limit's request %v, want the limit", r.Requests)
	}
}

func TestPodForDiskLimit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		def, specDisk int64
		want          int64 // 0: no ephemeral-storage limit
	}{
		{"none", 0, 0, 0},
		{"runner default", 10 << 30, 0, 10 << 30},
		{"spec overrides the default", 10 << 30, 1 << 30, 1 << 30},
		{"spec alone", 0, 512 << 20, 512 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", DiskBytes: tc.def}}
			spec := &runtime.Spec{ID: "abc", Container: runtime.Container{Image: "busybox", Resources: runtime.Resources{DiskBytes: tc.specDisk}}}
			main := b.podFor(spec, "", b.labels(spec), nil, nil).Spec.Containers[1]
			got, ok := main.Resources.Limits[corev1.ResourceEphemeralStorage]
			switch {
			case tc.want == 0 && ok:
				t.Errorf("ephemeral-storage limit %s, want none", got.String())
			case tc.want != 0 && (!ok || got.Value() != tc.want):
				t.Errorf("ephemeral-storage limit %s (set %v), want %d", got.String(), ok, tc.want)
			}
			if req, ok := main.Resources.Requests[corev1.ResourceEphemeralStorage]; tc.want != 0 && (!ok || !req.IsZero()) {
				t.Errorf("ephemeral-storage request %s (set %v), want an explicit 0: a cap, not a reservation", req.String(), ok)
			}
			if _, ok := main.Resources.Limits[corev1.ResourceCPU]; ok {
				t.Errorf("a CPU limit appeared: %v", main.Resources.Limits)
			}
		})
	}
}
