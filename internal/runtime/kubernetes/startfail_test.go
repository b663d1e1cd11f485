package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Messages as a real cluster shows them (containerd 1.6 + runc: test/k8s
// TestContainerCreateFailure; the others from the kubelet's and containerd's sources).
const (
	runcCwdFile = `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: mkdir /bin/busybox: not a directory: unknown`
	runcEROFS   = `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: mkdir /data/work: read-only file system: unknown`
)

func waitingState(reason, msg string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
}

func startFailedState(msg string) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 128, Reason: "StartError", Message: msg, StartedAt: metav1.Unix(0, 0), FinishedAt: metav1.Now()}}
}

var runningState = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}

// TestStartErrorCreateFailures: every reason the kubelet gives a container it or the
// runtime could not create or start fails the start at once, naming the container and
// quoting the runtime's message; the spec's fault is ErrInvalidSpec (StartError), the
// runner's own container's or the node's is not (BackendError); a cause the kubelet
// resolves on a later sync is no failure.
func TestStartErrorCreateFailures(t *testing.T) {
	spec := &runtime.Spec{Container: runtime.Container{Name: "app", Image: "img"}}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		spec      bool     // the spec's fault (ErrInvalidSpec)
		want      error    // another sentinel
		contains  []string // in the error
		transient bool     // no error
	}{
		{"runc create fails (containerd: terminated StartError)", podWith(startFailedState(runcCwdFile), runningState, corev1.PodRunning), true, nil,
			[]string{`container "app"`, "StartError (exit code 128)", "mkdir /bin/busybox: not a directory"}, false},
		{"runc EROFS on a working dir", podWith(startFailedState(runcEROFS), runningState, corev1.PodRunning), true, nil,
			[]string{`container "app"`, "read-only file system"}, false},
		{"RunContainerError (before the relist shows it terminated)", podWith(waitingState("RunContainerError", runcCwdFile), runningState, corev1.PodRunning), true, nil,
			[]string{`container "app"`, "RunContainerError", "not a directory"}, false},
		{"CreateContainerError (CRI-O runs runc create here)", podWith(waitingState("CreateContainerError", "container create failed: chdir to cwd (\"/etc/passwd\") set in config.json failed: not a directory"), runningState, corev1.PodPending), true, nil,
			[]string{`container "app"`, "CreateContainerError", "chdir to cwd"}, false},
		{"CreateContainerConfigError: runAsNonRoot", podWith(waitingState("CreateContainerConfigError", "container has runAsNonRoot and image will run as root"), runningState, corev1.PodPending), true, nil,
			[]string{`container "app"`, "runAsNonRoot"}, false},
		{"CreateContainerConfigError: a Secret deleted since the check", podWith(waitingState("CreateContainerConfigError", `secret "creds" not found`), runningState, corev1.PodPending), true, nil,
			[]string{`secret "creds" not found`}, false},
		{"InvalidImageName", podWith(waitingState("InvalidImageName", `Failed to apply default image tag "Bad//Name": couldn't parse image reference`), runningState, corev1.PodPending), false, runtime.ErrInvalidImageRef,
			[]string{"InvalidImageName", "couldn't parse"}, false},
		{"the gate's create fails: the runner's", podWith(runningState, startFailedState(runcCwdFile), corev1.PodRunning), false, nil,
			[]string{"the runner's gate container", "StartError"}, false},
		{"the gate's hook fails: the runner's", podWith(waitingState("ContainerCreating", ""), waitingState("PostStartHookError", "exec: install: exit 1"), corev1.PodPending), false, nil,
			[]string{"the runner's gate container", "PostStartHookError"}, false},
		{"the gate: a node fault is the runner's", podWith(waitingState("ContainerCreating", ""), startFailedState("OCI runtime create failed: runc create failed: unable to apply cgroup configuration: mkdir /sys/fs/cgroup/x: no space left on device: unknown"), corev1.PodRunning), false, nil,
			[]string{"the runner's gate container", "cgroup"}, false},
		{"a workload message worded as a node fault is still the spec's", podWith(startFailedState("runc create failed: mkdir /data/cgroup: no space left on device: read-only file system"), runningState, corev1.PodRunning), true, nil,
			[]string{`container "app"`}, false},
		{"secret cache not synced yet: the kubelet retries", podWith(waitingState("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"), runningState, corev1.PodPending), false, nil, nil, true},
		{"configmap cache not synced yet", podWith(waitingState("CreateContainerConfigError", "failed to sync configmap cache: timed out waiting for the condition"), runningState, corev1.PodPending), false, nil, nil, true},
		{"container name still reserved after a timed-out create", podWith(waitingState("CreateContainerError", `failed to reserve container name "sandbox_sbx-x_sbx_u_0": name "sandbox_sbx-x_sbx_u_0" is reserved for "4f1e"`), runningState, corev1.PodPending), false, nil, nil, true},
		{"CRI-O: container name still reserved", podWith(waitingState("CreateContainerError", `error reserving ctr name k8s_sandbox_sbx-x_sbx_u_0 for id 4f1e: name is reserved`), runningState, corev1.PodPending), false, nil, nil, true},
		{"kubelet just restarted: Services not listed yet", podWith(waitingState("CreateContainerConfigError", "services have not yet been read at least once, cannot construct envvars"), runningState, corev1.PodPending), false, nil, nil, true},
		{"PreStartHookError: the kubelet's resource managers (retried, not final)", podWith(waitingState("PreStartHookError", "failed to allocate cpuset: not enough cpus available"), runningState, corev1.PodPending), false, nil, nil, true},
		{"a pull's 401 past the quoted bound still classifies", podWith(waitingState("ErrImagePull", "failed to pull: "+strings.Repeat("x", 2*maxStartMessage)+": 401 Unauthorized"), runningState, corev1.PodPending), false, runtime.ErrImageUnauthorized,
			[]string{"ErrImagePull"}, false},
		{"a pull's not found past the quoted bound still classifies", podWith(waitingState("ErrImagePull", "failed to resolve: "+strings.Repeat("x", 2*maxStartMessage)+": not found"), runningState, corev1.PodPending), false, runtime.ErrImageNotFound,
			[]string{"ErrImagePull"}, false},
		{"a Pod being deleted: a start the deletion canceled is not the spec's", deleting(podWith(startFailedState("runc create failed: context canceled"), runningState, corev1.PodRunning)), false, nil, nil, true},
		{"a Pod being deleted: RunContainerError", deleting(podWith(waitingState("RunContainerError", runcCwdFile), runningState, corev1.PodRunning)), false, nil, nil, true},
		{"CreateContainer timed out", podWith(waitingState("CreateContainerError", "context deadline exceeded"), runningState, corev1.PodPending), false, nil, nil, true},
		{"ContainerCreating", podWith(waitingState("ContainerCreating", ""), waitingState("ContainerCreating", ""), corev1.PodPending), false, nil, nil, true},
		{"PodInitializing", podWith(waitingState("PodInitializing", ""), runningState, corev1.PodPending), false, nil, nil, true},
		{"a command that ran and failed is an exit, not a start failure", podWith(corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "StartError OCI runtime create failed", StartedAt: metav1.Now()}}, runningState, corev1.PodRunning), false, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := startError(tc.pod, spec)
			if tc.transient {
				if err != nil {
					t.Fatalf("startError = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("startError = nil, want a failure")
			}
			if errors.Is(err, runtime.ErrInvalidSpec) != tc.spec {
				t.Errorf("startError = %v: the spec's fault %v, want %v", err, errors.Is(err, runtime.ErrInvalidSpec), tc.spec)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("startError = %v, want %v", err, tc.want)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("startError = %q, does not say %q", err, s)
				}
			}
		})
	}
}

// TestStartErrorMessageClipped: the kubelet's and the runtime's messages are quoted at
// most maxStartMessage bytes, valid UTF-8, without control characters, however large.
func TestStartErrorMessageClipped(t *testing.T) {
	huge := "runc create failed: mkdir /\x1b[31m" + strings.Repeat("\xff/x\n", 1<<20)
	for name, pod := range map[string]*corev1.Pod{
		"terminated": podWith(startFailedState(huge), runningState, corev1.PodRunning),
		"waiting":    podWith(waitingState("CreateContainerError", huge), runningState, corev1.PodPending),
		"pull":       podWith(waitingState("ErrImagePull", huge), runningState, corev1.PodPending),
	} {
		err := startError(pod, nil)
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		msg := err.Error()
		// The message, twice at most for a pull (the error's text and the reason's), and
		// the words around it.
		if len(msg) > 2*maxStartMessage+256 {
			t.Errorf("%s: error of %d bytes", name, len(msg))
		}
		if !strings.Contains(msg, textclip.Marker) {
			t.Errorf("%s: the cut is not marked: %q", name, msg)
		}
		if !utf8.ValidString(msg) || strings.ContainsAny(msg, "\n\x1b") {
			t.Errorf("%s: not printable UTF-8: %q", name, msg)
		}
	}
	// podSummary (the timeout's message) quotes waiting messages bounded too.
	p := podWith(waitingState("ContainerCreating", strings.Repeat("x", 1<<20)), runningState, corev1.PodPending)
	if n := len(podSummary(p)); n > maxStartMessage+256 {
		t.Errorf("podSummary of %d bytes", n)
	}
}

// TestStartErrorGroup: any container of a group that cannot be created fails it, named
// as the spec names it (a Pod name of the c<index>- form given to a reserved name too).
func TestStartErrorGroup(t *testing.T) {
	spec := &runtime.Spec{
		Container:      runtime.Container{Name: "app", Image: "img"},
		Sidecars:       []runtime.Container{{Name: "web", Image: "img"}, {Name: "gate", Image: "img"}},
		InitContainers: []runtime.Container{{Name: "setup", Image: "img"}},
	}
	pods := map[string]string{}
	for _, m := range members(spec) {
		pods[m.name] = m.pod
	}
	if pods["gate"] == containerGate {
		t.Fatalf("a sidecar named gate kept the gate's Pod name")
	}
	group := func(failing string, st corev1.ContainerState) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: containerInstall, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}},
				{Name: pods["setup"], State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}}}}
		for _, n := range []string{containerGate, containerMain, pods["web"], pods["gate"]} {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: n, State: runningState})
		}
		for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
			for i := range list {
				if list[i].Name == failing {
					list[i].State = st
				}
			}
		}
		return p
	}
	for _, tc := range []struct{ pod, want string }{
		{containerMain, `container "app"`},
		{pods["web"], `container "web"`},
		{pods["gate"], `container "gate"`},
		{pods["setup"], `container "setup"`},
	} {
		for _, st := range []corev1.ContainerState{startFailedState(runcEROFS), waitingState("CreateContainerError", runcEROFS)} {
			err := startError(group(tc.pod, st), spec)
			if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "read-only file system") {
				t.Errorf("%s failing: %v, want ErrInvalidSpec naming %s", tc.pod, err, tc.want)
			}
		}
	}
	if err := startError(group("", runningState), spec); err != nil {
		t.Errorf("a group starting: %v", err)
	}
	// The runner's install init container is the runner's.
	if err := startError(group(containerInstall, startFailedState(runcCwdFile)), spec); err == nil || errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "the runner's install container") {
		t.Errorf("install failing: %v", err)
	}
}

// TestWaitRunningCreateFailure: Create's wait fails as soon as the Pod shows the
// sandbox's container terminated by a runtime create failure (the gate still running,
// so the Pod has not ended), not at StartTimeout.
func TestWaitRunningCreateFailure(t *testing.T) {
	b := &Backend{cfg: Config{StartTimeout: 5 * time.Second}}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "img"}}
	s := &sandbox{id: "x", spec: spec, pod: podWith(waitingState("ContainerCreating", ""), runningState, corev1.PodPending),
		changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		time.Sleep(100 * time.Millisecond)
		b.mu.Lock()
		s.pod = podWith(startFailedState(runcCwdFile), runningState, corev1.PodRunning)
		close(s.changed)
		s.changed = make(chan struct{})
		b.mu.Unlock()
	}()
	start := time.Now()
	_, err := b.waitRunning(context.Background(), s)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("waitRunning took %s", d)
	}
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `container "app"`) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("waitRunning = %v, want the create failure", err)
	}
}

// TestWaitPodInitCreateFailure: a group's init container that the runtime failed to
// start is terminated too; its Start (waitPod) reports the create failure, not "ran".
func TestWaitPodInitCreateFailure(t *testing.T) {
	b := &Backend{cfg: Config{StartTimeout: 5 * time.Second}}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "img"},
		InitContainers: []runtime.Container{{Name: "setup", Image: "img"}}}
	pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
		InitContainerStatuses: []corev1.ContainerStatus{{Name: "setup", State: startFailedState(runcCwdFile)}}}}
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{})}
	_, err := b.waitPod(context.Background(), s, "setup", func(p *corev1.Pod) (bool, error) {
		cs := podContainerStatus(p.Status.InitContainerStatuses, "setup")
		return cs != nil && (cs.State.Running != nil || cs.State.Terminated != nil), nil
	})
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `container "setup"`) {
		t.Errorf("waitPod = %v, want the create failure naming setup", err)
	}
}

// TestRecoverCreateFailure: a runner restarted while its Pod's sandbox container could
// not be created reports the create failure (StartError, naming the container), not a
// vanished sandbox, and does not wait for an agent that cannot answer.
func TestRecoverCreateFailure(t *testing.T) {
	lb, _ := newFakeBackend(t, Config{})
	spec := &runtime.Spec{ID: "cf1", Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh"}}
	objs := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: runningState}, {Name: containerMain, State: startFailedState(runcCwdFile)}}, nil)
	objs[1].(*corev1.Pod).Status.PodIP = "10.0.0.9"
	b, _ := newFakeBackend(t, Config{StartTimeout: 10 * time.Minute}, objs...)
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("recovered %d, want 1", len(recs))
	}
	if r := recs[0]; r.Alive || r.Exit == nil || r.Exit.Reason != "StartError" || !strings.Contains(r.Exit.Message, `container "app"`) || !strings.Contains(r.Exit.Message, "not a directory") {
		t.Errorf("recovered %+v (exit %+v), want StartError naming the container", r, r.Exit)
	}
}

// TestRecoverDeletedCreateFailure: a Pod deleted during its Create whose container's
// start the deletion canceled is not recovered as the spec's StartError.
func TestRecoverDeletedCreateFailure(t *testing.T) {
	lb, _ := newFakeBackend(t, Config{})
	spec := &runtime.Spec{ID: "cf2", Container: runtime.Container{Name: "app", Image: "busybox", Command: "sh"}}
	objs := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: runningState}, {Name: containerMain, State: startFailedState("runc create failed: context canceled")}}, nil)
	deleting(objs[1].(*corev1.Pod))
	objs[1].(*corev1.Pod).Finalizers = []string{"test/keep"} // the fake keeps a Pod with a DeletionTimestamp only with one
	b, _ := newFakeBackend(t, Config{StartTimeout: 10 * time.Minute}, objs...)
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Exit != nil && r.Exit.Reason == "StartError" {
			t.Errorf("recovered %+v (exit %+v), want no StartError for a Pod being deleted", r, r.Exit)
		}
	}
}

// TestGroupStartError: a group's start sequence failing on a container that cannot
// start keeps its StartError when the spec is at fault, and takes the single-container
// reasons otherwise (an image: ImagePullFailed's sentinels; the runner's or the node's:
// no sentinel, BackendError), naming the container either way.
func TestGroupStartError(t *testing.T) {
	spec := &runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "img"},
		Sidecars: []runtime.Container{{Name: "web", Image: "img"}, {Name: "db", Image: "img"}}}
	seq := fmt.Errorf("wrapped: %w", &startseq.Failure{Container: "web", Reason: startseq.ReasonStartError, Message: "did not start: x"})
	var f *startseq.Failure
	if err := groupStartError(seq, nil, spec); !errors.As(err, &f) {
		t.Errorf("no start failure: %v", err)
	}
	if err := groupStartError(seq, &containerFailure{Pod: "web", err: fmt.Errorf("%w: container \"web\" could not be created", runtime.ErrInvalidSpec)}, spec); !errors.As(err, &f) {
		t.Errorf("the spec's fault: %v, want the start sequence's StartError", err)
	}
	for _, serr := range []error{
		&containerFailure{Pod: "web", err: fmt.Errorf("pull img: %w: ErrImagePull: nope", runtime.ErrImageNotFound)},
		&containerFailure{Pod: containerGate, err: errors.New("the runner's gate container could not be created or started: StartError: x")},
	} {
		err := groupStartError(seq, serr, spec)
		if errors.As(err, &f) || !errors.Is(err, serr) || !strings.Contains(err.Error(), `container "web"`) {
			t.Errorf("%v: %v, want it without the start sequence's reason, naming web", serr, err)
		}
	}
	// Another container's failure, or a failure of the sequence that is not web's start
	// error, keeps the sequence's reason.
	pullDB := &containerFailure{Pod: "db", err: fmt.Errorf("pull img: %w: ErrImagePull: nope", runtime.ErrImageNotFound)}
	if err := groupStartError(seq, pullDB, spec); !errors.As(err, &f) || f.Container != "web" {
		t.Errorf("db's failure swapped web's StartError: %v", err)
	}
	pullWeb := &containerFailure{Pod: "web", err: fmt.Errorf("pull img: %w: ErrImagePull: nope", runtime.ErrImageNotFound)}
	for _, reason := range []string{startseq.ReasonInitFailed, startseq.ReasonProbeFailed, startseq.ReasonDependencyFailed} {
		other := &startseq.Failure{Container: "web", Reason: reason, Message: "x"}
		if err := groupStartError(other, pullWeb, spec); !errors.As(err, &f) || f.Reason != reason {
			t.Errorf("%s swapped for the Pod's error: %v", reason, err)
		}
	}
}

// TestWaitPodInitCompletedBeforeNextFails: init1 completed while init2 failed to start
// in the same status: waiting for init1 reports it done, not init2's failure.
func TestWaitPodInitCompletedBeforeNextFails(t *testing.T) {
	b := &Backend{cfg: Config{StartTimeout: 5 * time.Second}}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "img"},
		InitContainers: []runtime.Container{{Name: "init1", Image: "img"}, {Name: "init2", Image: "img"}}}
	pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
		InitContainerStatuses: []corev1.ContainerStatus{
			{Name: "init1", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}},
			{Name: "init2", State: startFailedState(runcCwdFile)}}}}
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{})}
	_, err := b.waitPod(context.Background(), s, "init1", func(p *corev1.Pod) (bool, error) {
		cs := podContainerStatus(p.Status.InitContainerStatuses, "init1")
		return cs != nil && cs.State.Terminated != nil, nil
	})
	if err != nil {
		t.Errorf("waitPod(init1) = %v, want done", err)
	}
	// init2's own wait reports its failure.
	_, err = b.waitPod(context.Background(), s, "init2", func(p *corev1.Pod) (bool, error) {
		cs := podContainerStatus(p.Status.InitContainerStatuses, "init2")
		return cs != nil && cs.State.Terminated != nil, nil
	})
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `container "init2"`) {
		t.Errorf("waitPod(init2) = %v, want its create failure", err)
	}
}

// TestWarmPodCreateFailure: a warm Pod is made by Create, so one whose container the
// runtime cannot create fails its refill at once with the reason (and its Pod is
// deleted), not after StartTimeout.
func TestWarmPodCreateFailure(t *testing.T) {
	b, cs := newFakeBackend(t, Config{MaxPrepull: -1, StartTimeout: time.Minute})
	spec := warmSpec("org-a")
	spec.ID = "warmcf01"
	spec.WorkingDir = "/etc/passwd"
	type result struct {
		w   *warmPod
		err error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		w, err := b.warm.make(&spec, "k1")
		res <- result{w, err}
	}()
	waitFor(t, "the warm pod", func() bool {
		_, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
		return err == nil
	})
	pod, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = podWith(startFailedState(runcCwdFile), runningState, corev1.PodRunning).Status
	if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err == nil || !errors.Is(r.err, runtime.ErrInvalidSpec) || !strings.Contains(r.err.Error(), "not a directory") {
			t.Errorf("make = %v, want the create failure", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("make still waiting after %s", time.Since(start))
	}
	waitFor(t, "the warm pod's deletion", func() bool {
		_, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(spec.ID), metav1.GetOptions{})
		return err != nil
	})
}

// TestPrepullOutcomeTransientInit: a pre-pull Pod's init container (the agent image)
// waiting on a transient create cause is not a failure, as for its main container; a
// final one is.
func TestPrepullOutcomeTransientInit(t *testing.T) {
	now := time.Now()
	pod := func(reason, msg string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "install", State: waitingState(reason, msg)}},
			ContainerStatuses:     []corev1.ContainerStatus{{Name: "noop", State: waitingState("PodInitializing", "")}}}}
	}
	for _, msg := range []string{
		"failed to sync configmap cache: timed out waiting for the condition",
		"services have not yet been read at least once, cannot construct envvars",
		"error reserving ctr name k8s_install_x for id 4f1e: name is reserved",
	} {
		for _, reason := range []string{"CreateContainerConfigError", "CreateContainerError"} {
			if done, _, why := prepullOutcome(pod(reason, msg), now, now, time.Minute); done {
				t.Errorf("%s %q: done (%s), want waiting", reason, msg, why)
			}
		}
	}
	if done, ok, _ := prepullOutcome(pod("CreateContainerConfigError", "container has runAsNonRoot and image will run as root"), now, now, time.Minute); !done || ok {
		t.Errorf("a final create failure of the init container: done %v ok %v, want failed", done, ok)
	}
	if done, ok, _ := prepullOutcome(pod("ErrImagePull", "not found"), now, now, time.Minute); !done || ok {
		t.Errorf("the agent image's pull failure: done %v ok %v, want failed", done, ok)
	}
}

// TestRecoveredStartExitReason: Recover's reason for a failed create is the runner's
// (runtime.CreateFailureReason), including the spec faults the runner alone knew of
// before (an unknown runtime class, an unsupported engine).
func TestRecoveredStartExitReason(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("x: %w", runtime.ErrInvalidSpec), fmt.Errorf("x: %w", runtime.ErrUnknownRuntime),
		fmt.Errorf("x: %w", runtime.ErrEngineUnsupported), fmt.Errorf("pull: %w", runtime.ErrImageNotFound),
		errors.New("the runner's gate container could not be created or started"),
	} {
		if got, want := recoveredStartExit(err).Reason, runtime.CreateFailureReason(err); got != want {
			t.Errorf("recoveredStartExit(%v).Reason = %q, want the runner's %q", err, got, want)
		}
	}
}

// TestPodSummaryBoundedForAGroup: a group's Pod of many containers, each waiting with a
// huge message, is summarized in at most maxPodSummary bytes of printable UTF-8.
func TestPodSummaryBoundedForAGroup(t *testing.T) {
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for i := 0; i < 64; i++ {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: fmt.Sprintf("c%d", i), State: waitingState("CreateContainerError", strings.Repeat("\xffx\n", 1<<12))})
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodConditionType(fmt.Sprintf("T%d", i)),
			Status: corev1.ConditionFalse, Reason: "R", Message: strings.Repeat("y", 1<<12)})
	}
	got := podSummary(p)
	if len(got) > maxPodSummary || !utf8.ValidString(got) || strings.ContainsAny(got, "\n") {
		t.Errorf("podSummary of %d bytes (valid %v), want at most %d of printable UTF-8", len(got), utf8.ValidString(got), maxPodSummary)
	}
	if !strings.HasPrefix(got, "phase Pending") {
		t.Errorf("podSummary = %.80q, want the phase first", got)
	}
}
