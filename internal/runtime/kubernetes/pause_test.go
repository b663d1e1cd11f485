package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeNodeAgent is a NodeAgent and NodeAgentDialer recording its calls; onCheckpoint, when
// set, runs inside Checkpoint (before it returns) and may fail it.
type fakeNodeAgent struct {
	mu           sync.Mutex
	nodes        []string
	checkpoints  []NodeCheckpointRequest
	deleted      []string
	onCheckpoint func(NodeCheckpointRequest) error
	agentErr     error           // Agent's error, when set
	answer       *NodeCheckpoint // Checkpoint's answer, when set
	listErr      error           // ListCheckpoints' error, when set
	// others: images ListCheckpoints lists beside the ones Checkpoint took (and
	// DeleteCheckpoint did not delete).
	others []NodeCheckpointEntry
}

// ListCheckpoints lists the images Checkpoint answered (each of the Pod and sandbox its
// request named) not deleted since, and others.
func (f *fakeNodeAgent) ListCheckpoints(context.Context) ([]NodeCheckpointEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []NodeCheckpointEntry
	for _, r := range f.checkpoints {
		cid := "c-test-1"
		if f.answer != nil {
			cid = f.answer.ID
		}
		if !slices.Contains(f.deleted, cid) {
			out = append(out, NodeCheckpointEntry{ID: cid, SandboxID: r.SandboxID, Namespace: r.Namespace, Name: r.Name, UID: r.UID, LeaveRunning: r.LeaveRunning})
		}
	}
	return append(out, f.others...), nil
}

func (f *fakeNodeAgent) Agent(_ context.Context, node string) (NodeAgent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, node)
	if f.agentErr != nil {
		return nil, f.agentErr
	}
	return f, nil
}

func (f *fakeNodeAgent) Checkpoint(_ context.Context, req NodeCheckpointRequest) (NodeCheckpoint, error) {
	f.mu.Lock()
	f.checkpoints = append(f.checkpoints, req)
	hook := f.onCheckpoint
	f.mu.Unlock()
	if hook != nil {
		if err := hook(req); err != nil {
			return NodeCheckpoint{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.answer != nil {
		return *f.answer, nil
	}
	return NodeCheckpoint{ID: "c-test-1", Node: "node-1", Bytes: 4096, Took: time.Millisecond}, nil
}

func (f *fakeNodeAgent) DeleteCheckpoint(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	return nil
}

func (f *fakeNodeAgent) deletedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.deleted...)
}

func gvisorSpec(id string) *runtime.Spec {
	return &runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"600"}}}
}

// pausable is a running gvisor sandbox on a fake API server: the Pod Create makes for
// spec (madePods), running on node-1, its Secret, pull Secret and NetworkPolicy owned by
// it, as Create leaves them.
func pausable(t *testing.T, spec *runtime.Spec, agent *fakeNodeAgent, opts ...func(*Config)) (*Backend, *fake.Clientset, *sandbox, *corev1.Pod) {
	t.Helper()
	mcfg := Config{StartTimeout: time.Second, MaxPrepull: -1, NodeAgents: &fakeNodeAgent{},
		RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}}
	for _, o := range opts {
		o(&mcfg)
	}
	pod := madePodsCfg(t, mcfg, spec)[0]
	pod.UID = types.UID("uid-" + spec.ID)
	pod.Spec.NodeName = "node-1"
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9"}
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	om := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "sbx", OwnerReferences: owner, Labels: map[string]string{LabelSandbox: spec.ID}}
	}
	cfg := Config{StartTimeout: time.Second, MaxPrepull: -1, RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}}
	if agent != nil {
		cfg.NodeAgents = agent
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, cs := newFakeBackend(t, cfg, pod,
		&corev1.Secret{ObjectMeta: om(secretName(spec.ID))},
		&corev1.Secret{ObjectMeta: om(pullSecretName(spec.ID))},
		&networkingv1.NetworkPolicy{ObjectMeta: om(networkPolicyName(spec.ID))})
	persisted := *spec
	s := &sandbox{id: spec.ID, spec: persisted, class: GVisorClass, changed: make(chan struct{}), done: make(chan struct{}),
		pod: pod, uid: pod.UID}
	b.mu.Lock()
	b.sandboxes[spec.ID] = s
	b.mu.Unlock()
	return b, cs, s, pod
}

// TestPauseMarksBeforeDelete: Pause checkpoints the Pod through the node agent of the
// Pod's node (leave_running=false, the Pod's namespace, name, UID and sandbox ID), and
// the Pod is deleted only once the sandbox's Secret is marked paused (checkpoint, node)
// and its Secret, pull Secret and NetworkPolicy no longer belong to it; the sandbox is
// then paused: Wait does not return, DialAgent is ErrPaused, a second Pause is
// ErrAlreadyPaused.
func TestPauseMarksBeforeDelete(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, s, pod := pausable(t, gvisorSpec("p-1"), agent)
	var atDelete []string
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		sec, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), "sbx", secretName("p-1"))
		if err != nil {
			atDelete = append(atDelete, "secret: "+err.Error())
			return false, nil, nil
		}
		so := sec.(*corev1.Secret)
		if so.Labels[labelPaused] != "true" || so.Annotations[annotationPausedCkpt] != "c-test-1" || so.Annotations[annotationPausedNode] != "node-1" {
			atDelete = append(atDelete, "secret not marked paused")
		}
		if len(so.OwnerReferences) != 0 {
			atDelete = append(atDelete, "secret still owned")
		}
		// The tracker, not the clientset: a reactor runs under the clientset's lock.
		pull, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), "sbx", pullSecretName("p-1"))
		if err != nil || len(pull.(*corev1.Secret).OwnerReferences) != 0 {
			atDelete = append(atDelete, "pull secret still owned")
		}
		np, err := cs.Tracker().Get(networkingv1.SchemeGroupVersion.WithResource("networkpolicies"), "sbx", networkPolicyName("p-1"))
		if err != nil || len(np.(*networkingv1.NetworkPolicy).OwnerReferences) != 0 {
			atDelete = append(atDelete, "network policy still owned")
		}
		atDelete = append(atDelete, "deleted")
		return false, nil, nil
	})
	// An agent connection given out before the pause (the runner's Watch) is closed by
	// it: its peer is gone with the sentry and would never reset it.
	mine, peer := net.Pipe()
	held, err := b.trackConn(s, mine)
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Pause(t.Context(), "p-1", true)
	if err != nil {
		t.Fatal(err)
	}
	_ = peer.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("an agent connection given out before the pause: read %v, want EOF (closed by the pause)", err)
	}
	_ = held.Close()
	if !info.Released || info.CheckpointBytes != 4096 {
		t.Errorf("PauseInfo %+v, want released with the checkpoint's 4096 bytes", info)
	}
	if len(agent.checkpoints) != 1 || agent.nodes[0] != "node-1" ||
		agent.checkpoints[0] != (NodeCheckpointRequest{Namespace: "sbx", Name: pod.Name, UID: string(pod.UID), SandboxID: "p-1"}) {
		t.Errorf("node agent asked %v on %v", agent.checkpoints, agent.nodes)
	}
	if strings.Join(atDelete, ",") != "deleted" {
		t.Errorf("when the Pod was deleted: %v", atDelete)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("paused Pod: %v, want gone", err)
	}
	// The informer's delete event must not end it either.
	time.Sleep(200 * time.Millisecond)
	wctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if ex, err := b.Wait(wctx, "p-1"); err == nil {
		t.Errorf("Wait of a paused sandbox returned %+v", ex)
	}
	if _, err := b.DialAgent(t.Context(), "p-1", ""); !errors.Is(err, runtime.ErrPaused) {
		t.Errorf("DialAgent of a paused sandbox: %v, want ErrPaused", err)
	}
	if _, err := b.Pause(t.Context(), "p-1", true); !errors.Is(err, runtime.ErrAlreadyPaused) {
		t.Errorf("second Pause: %v, want ErrAlreadyPaused", err)
	}
	b.mu.Lock()
	paused := s.paused
	b.mu.Unlock()
	if paused == nil || paused.CheckpointID != "c-test-1" || paused.Node != "node-1" {
		t.Errorf("paused state %+v", paused)
	}
}

// TestPauseCheckpointEndsPodNotSandbox: the checkpoint ends the Pod's containers (the
// Pod goes Failed while Pause runs, as it does on the cluster): that does not end a
// sandbox being paused. A checkpoint that fails after its Pod ended does end it.
func TestPauseCheckpointEndsPodNotSandbox(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, s, pod := pausable(t, gvisorSpec("p-2"), agent)
	endPod := func(NodeCheckpointRequest) error {
		p := pod.DeepCopy()
		p.Status.Phase = corev1.PodFailed
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerMain, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
		if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			return err
		}
		// Until the informer has shown the sandbox the ended Pod.
		for range 100 {
			b.mu.Lock()
			seen := podEnded(s.pod)
			b.mu.Unlock()
			if seen {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	agent.onCheckpoint = endPod
	if _, err := b.Pause(t.Context(), "p-2", true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
		t.Fatalf("the checkpoint's end of the Pod ended the sandbox: %+v", s.exit)
	default:
	}

	b2, cs2, s2, pod2 := pausable(t, gvisorSpec("p-3"), &fakeNodeAgent{})
	b, cs, s, pod = b2, cs2, s2, pod2
	b.cfg.NodeAgents.(*fakeNodeAgent).onCheckpoint = func(r NodeCheckpointRequest) error {
		_ = endPod(r)
		return errors.New("runsc checkpoint failed")
	}
	if _, err := b.Pause(t.Context(), "p-3", true); err == nil || !strings.Contains(err.Error(), "runsc checkpoint failed") {
		t.Fatalf("Pause with a failed checkpoint: %v", err)
	}
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
		t.Fatal("a failed checkpoint that ended the Pod left the sandbox running")
	}
	if sec, _ := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-3"), metav1.GetOptions{}); sec == nil || sec.Labels[labelPaused] != "" || len(sec.OwnerReferences) == 0 {
		t.Errorf("after a failed checkpoint the Secret is %+v, want unmarked and still owned", sec)
	}
}

// TestResumePod: Resume makes the Pod again as Create made it (same containers and
// volumes: a restore needs a compatible spec), with the restore annotation naming the
// checkpoint and pinned to the checkpoint's node. A restore that does not come up (no
// kubelet here: StartTimeout) deletes its Pod and leaves the sandbox paused, its
// checkpoint kept.
func TestResumePod(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, s, pod := pausable(t, gvisorSpec("p-4"), agent)
	if _, err := b.Pause(t.Context(), "p-4", true); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var made *corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		made = a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		mu.Unlock()
		return false, nil, nil
	})
	_, err := b.Resume(t.Context(), "p-4")
	if err == nil {
		t.Fatal("Resume without a kubelet succeeded")
	}
	if errors.Is(err, runtime.ErrCheckpointLost) {
		t.Errorf("a timed-out restore called the checkpoint lost: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if made == nil {
		t.Fatal("Resume made no Pod")
	}
	if made.Annotations[runtime.RestoreCheckpointAnnotation] != "c-test-1" {
		t.Errorf("resumed Pod annotations %v, want the restore annotation", made.Annotations)
	}
	na := made.Spec.Affinity
	if na == nil || na.NodeAffinity == nil || na.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		na.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0] != "node-1" {
		t.Errorf("resumed Pod not pinned to node-1: %+v", made.Spec.Affinity)
	}
	if !reflect.DeepEqual(made.Spec.Containers, pod.Spec.Containers) || !reflect.DeepEqual(made.Spec.Volumes, pod.Spec.Volumes) {
		t.Errorf("resumed Pod's containers/volumes differ from Create's:\n%+v\n%+v", made.Spec.Containers, pod.Spec.Containers)
	}
	for k, v := range pod.Annotations {
		if made.Annotations[k] != v {
			t.Errorf("resumed Pod annotation %s = %q, Create's %q", k, made.Annotations[k], v)
		}
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName("p-4"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed restore's Pod: %v, want deleted", err)
	}
	b.mu.Lock()
	paused := s.paused != nil
	b.mu.Unlock()
	if !paused || len(agent.deletedIDs()) != 0 {
		t.Errorf("after a failed resume: paused %v, checkpoints deleted %v; want paused, none deleted", paused, agent.deletedIDs())
	}
}

// TestStopPausedDeletesCheckpoint: Stop of a paused sandbox deletes its checkpoint and
// Wait returns Reason "Stopped"; Destroy then deletes its Secrets and NetworkPolicy
// (no longer the Pod's to take).
func TestStopPausedDeletesCheckpoint(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, _, _ := pausable(t, gvisorSpec("p-5"), agent)
	if _, err := b.Pause(t.Context(), "p-5", true); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(t.Context(), "p-5", time.Second); err != nil {
		t.Fatal(err)
	}
	if got := agent.deletedIDs(); len(got) != 1 || got[0] != "c-test-1" {
		t.Errorf("checkpoints deleted %v, want [c-test-1]", got)
	}
	ex, err := b.Wait(t.Context(), "p-5")
	if err != nil || ex.Reason != "Stopped" {
		t.Errorf("Wait = %+v, %v; want Reason Stopped", ex, err)
	}
	if err := b.Destroy(t.Context(), "p-5"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{secretName("p-5"), pullSecretName("p-5")} {
		if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("secret %s after Destroy: %v", n, err)
		}
	}

	// Destroy alone (no Stop) deletes the checkpoint too.
	agent2 := &fakeNodeAgent{}
	b2, _, _, _ := pausable(t, gvisorSpec("p-6"), agent2)
	if _, err := b2.Pause(t.Context(), "p-6", true); err != nil {
		t.Fatal(err)
	}
	if err := b2.Destroy(t.Context(), "p-6"); err != nil {
		t.Fatal(err)
	}
	if got := agent2.deletedIDs(); len(got) != 1 || got[0] != "c-test-1" {
		t.Errorf("Destroy of a paused sandbox: checkpoints deleted %v, want [c-test-1]", got)
	}
}

// TestPauseRefused: the backend never freezes; it checkpoints only the gvisor class, and
// only with node agents configured — each refusal with a reason naming gvisor; Pause with
// release=false is not implemented; specs slice 1 does not cover are refused.
func TestPauseRefused(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxPrepull: -1, RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}})
	for _, class := range []string{"", "runc", "gvisor"} {
		s := b.PauseSupport(class)
		if s.Freeze || s.Checkpoint || !strings.Contains(s.Why, "gvisor") {
			t.Errorf("without node agents: PauseSupport(%q) = %+v, want nothing with a reason naming gvisor", class, s)
		}
	}
	b.cfg.NodeAgents = &fakeNodeAgent{}
	if s := b.PauseSupport("gvisor"); !s.Checkpoint || s.Freeze {
		t.Errorf("with node agents: PauseSupport(gvisor) = %+v, want Checkpoint", s)
	}
	for _, class := range []string{"", "runc"} {
		if s := b.PauseSupport(class); s.Checkpoint || s.Freeze || !strings.Contains(s.Why, "gvisor") {
			t.Errorf("with node agents: PauseSupport(%q) = %+v, want refused naming gvisor", class, s)
		}
	}
	if _, err := b.Pause(t.Context(), "x", false); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Pause(release=false) = %v, want ErrNotImplemented", err)
	}

	multi := gvisorSpec("p-m")
	multi.Name = "app"
	multi.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sleep", Args: []string{"60"}}}
	scratch := gvisorSpec("p-s")
	scratch.Volumes = []runtime.Volume{{Name: "scratch", Medium: runtime.MediumDisk}}
	scratch.VolumeMounts = []runtime.VolumeMount{{Volume: "scratch", Path: "/scratch"}}
	runc := gvisorSpec("p-r")
	runc.RuntimeClass = "runc"
	for spec, want := range map[*runtime.Spec]string{multi: "multi-container", scratch: "scratch volumes", runc: "gvisor"} {
		agent := &fakeNodeAgent{}
		pb, _, s, _ := pausable(t, spec, agent)
		s.class = spec.RuntimeClass
		_, err := pb.Pause(t.Context(), spec.ID, true)
		if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), want) {
			t.Errorf("Pause of %s: %v, want ErrNotImplemented saying %q", spec.ID, err, want)
		}
		if len(agent.checkpoints) != 0 {
			t.Errorf("Pause of %s asked the node agent", spec.ID)
		}
	}
	// Egress secrets: their CA files are in a host-backed emptyDir, not in the checkpoint.
	egress := egressSecretSpec("p-e")
	egress.RuntimeClass = GVisorClass
	agent := &fakeNodeAgent{}
	pb, _, _, pod := pausable(t, egress, agent, func(c *Config) { c.Egress = testEgress() })
	if _, err := pb.Pause(t.Context(), egress.ID, true); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "egress secrets") {
		t.Errorf("Pause of a sandbox with egress secrets: %v, want ErrNotImplemented saying egress secrets", err)
	}
	if len(agent.checkpoints) != 0 {
		t.Error("Pause of a sandbox with egress secrets asked the node agent")
	}
	// Nor does its Pod carry the pausable Pods' cost: no bin tmpfs hint.
	if v, ok := pod.Annotations[gvisorMountAnnotation+"bin.type"]; ok {
		t.Errorf("a sandbox with egress secrets got the bin hint %q on a runner with node agents", v)
	}
	if _, err := b.Resume(t.Context(), "nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Resume of an unknown sandbox: %v", err)
	}
}

// TestPauseCallerGoneAfterCheckpoint: once the checkpoint is taken (the sandbox's
// processes are gone) a caller that goes away does not lose the image: the marks are
// written (a transient API error is tried again), the Pod is deleted, the sandbox is
// paused and its checkpoint kept.
func TestPauseCallerGoneAfterCheckpoint(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, s, _ := pausable(t, gvisorSpec("p-c"), agent)
	ctx, cancel := context.WithCancel(t.Context())
	agent.onCheckpoint = func(NodeCheckpointRequest) error { cancel(); return nil }
	failures := 1
	cs.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() == secretName("p-c") && failures > 0 {
			failures--
			return true, nil, apierrors.NewServiceUnavailable("flaky")
		}
		return false, nil, nil
	})
	if _, err := b.Pause(ctx, "p-c", true); err != nil {
		t.Fatalf("Pause whose caller went away after the checkpoint: %v", err)
	}
	if d := agent.deletedIDs(); len(d) != 0 {
		t.Errorf("checkpoints deleted %v, want none", d)
	}
	b.mu.Lock()
	paused := s.paused != nil
	b.mu.Unlock()
	if !paused {
		t.Error("the sandbox is not paused")
	}
	sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-c"), metav1.GetOptions{})
	if err != nil || sec.Labels[labelPaused] != "true" {
		t.Errorf("Secret %v (%v), want marked paused", sec, err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName("p-c"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the checkpointed Pod: %v, want deleted", err)
	}
}

// TestCheckpointLostReasons: only the shim's refusals of the image itself, in the
// restored Pod's events, lose the checkpoint; a generic restore failure, the Pod's own
// output or an error without events do not.
func TestCheckpointLostReasons(t *testing.T) {
	base := errors.New("the restored Pod ended")
	ev := func(msg string) error {
		return &podEventsError{err: base, events: []string{"FailedCreatePodSandBox: " + msg}}
	}
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{ev("rpc error: code = NotFound desc = sandboxd restore: checkpoint c-1: incomplete image (no sandboxd-complete): not found"), true},
		{ev("sandboxd restore: checkpoint c-1: no such checkpoint (lstat /x/c-1: no such file or directory): not found"), true},
		{ev("sandboxd restore: annotation dev.sandboxd.restore.checkpoint-id: invalid checkpoint id (want ...): invalid argument"), true},
		{ev("sandboxd restore: /ckpt/c-1: not a directory owned by root and writable only by it: invalid argument"), true},
		{ev("sandboxd restore: /var (a parent of the checkpoint root): not a directory owned by root and writable only by it (or sticky): failed precondition"), false},
		{ev("failed to start containerd task: runsc restore failed: restore failed: some transient error"), false},
		{ev("Back-off pulling image"), false},
		{fmt.Errorf("the restored Pod ended: terminated: incomplete image invalid checkpoint id restore failed"), false},
		{errors.New("sandboxd restore: checkpoint c-1: incomplete image"), false}, // not from an event
	} {
		if got := checkpointLost(c.err); got != c.lost {
			t.Errorf("checkpointLost(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}

// TestResumeRestoreFails: a restored Pod failing with the shim's "incomplete image" in
// its events is ErrCheckpointLost; one failing with a generic runsc restore failure keeps
// the sandbox paused (its checkpoint kept, Resume may be tried again); a checkpoint node
// whose agent is not found is ErrCheckpointLost before any Pod is made.
func TestResumeRestoreFails(t *testing.T) {
	for i, c := range []struct {
		msg  string
		lost bool
	}{
		{"sandboxd restore: checkpoint c-test-1: incomplete image (no sandboxd-complete): not found", true},
		{"runsc restore failed: restore failed: something transient", false},
	} {
		id := fmt.Sprintf("p-rf%d", i)
		agent := &fakeNodeAgent{}
		b, cs, s, _ := pausable(t, gvisorSpec(id), agent)
		if _, err := b.Pause(t.Context(), id, true); err != nil {
			t.Fatal(err)
		}
		uid := types.UID("uid-restored-" + id)
		if _, err := cs.CoreV1().Events("sbx").Create(t.Context(), &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "ev-" + id, Namespace: "sbx"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: podName(id), UID: uid},
			Type:           corev1.EventTypeWarning, Reason: "FailedCreatePodSandBox", Message: c.msg,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
			p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
			p.UID = uid
			p.Status.Phase = corev1.PodFailed
			return false, nil, nil
		})
		_, err := b.Resume(t.Context(), id)
		if err == nil {
			t.Fatalf("%s: Resume of a failing restore succeeded", c.msg)
		}
		if got := errors.Is(err, runtime.ErrCheckpointLost); got != c.lost {
			t.Errorf("%s: Resume error %v: ErrCheckpointLost %v, want %v", c.msg, err, got, c.lost)
		}
		b.mu.Lock()
		paused := s.paused != nil
		b.mu.Unlock()
		if !paused || len(agent.deletedIDs()) != 0 {
			t.Errorf("%s: after the failed resume paused %v, deleted %v; want still paused, nothing deleted (the runner decides)", c.msg, paused, agent.deletedIDs())
		}
	}

	agent := &fakeNodeAgent{}
	b, cs, _, _ := pausable(t, gvisorSpec("p-rf-node"), agent)
	if _, err := b.Pause(t.Context(), "p-rf-node", true); err != nil {
		t.Fatal(err)
	}
	agent.mu.Lock()
	agent.agentErr = fmt.Errorf("node node-1: %w", errdefs.ErrNotFound)
	agent.mu.Unlock()
	created := false
	cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		created = true
		return false, nil, nil
	})
	if _, err := b.Resume(t.Context(), "p-rf-node"); !errors.Is(err, runtime.ErrCheckpointLost) || created {
		t.Errorf("Resume on a node without agent: %v, Pod made %v; want ErrCheckpointLost, none", err, created)
	}
	agent.mu.Lock()
	agent.agentErr = errors.New("connection refused")
	agent.mu.Unlock()
	if _, err := b.Resume(t.Context(), "p-rf-node"); err == nil || errors.Is(err, runtime.ErrCheckpointLost) {
		t.Errorf("Resume with the node agent unreachable: %v; want an error, not ErrCheckpointLost", err)
	}
}

// TestPauseEgressForgotten: a sandbox with host-name egress rules leaves the egress
// registry when its pause starts (before the checkpoint ends its processes and its Pod's
// IP can go to another Pod), and is not registered again while paused.
func TestPauseEgressForgotten(t *testing.T) {
	agent := &fakeNodeAgent{}
	spec := hostNameSpec("p-eg", runtime.EgressRule{DNSName: "api.example.com"})
	spec.RuntimeClass = GVisorClass
	b, _, s, _ := pausable(t, spec, agent, func(c *Config) { c.Egress = testEgress() })
	ip := netip.MustParseAddr("10.0.0.9")
	b.mu.Lock()
	b.egressObserveLocked(s)
	b.mu.Unlock()
	if !b.EgressKnown(ip) {
		t.Fatal("the running sandbox's IP is not registered")
	}
	var atCheckpoint bool
	agent.onCheckpoint = func(NodeCheckpointRequest) error { atCheckpoint = b.EgressKnown(ip); return nil }
	if _, err := b.Pause(t.Context(), "p-eg", true); err != nil {
		t.Fatal(err)
	}
	if atCheckpoint {
		t.Error("the sandbox's IP was still registered at its checkpoint")
	}
	if b.EgressKnown(ip) {
		t.Error("the paused sandbox's IP is registered")
	}
}

// TestPauseBadAgentAnswer: a checkpoint ID the shim would not take, or a checkpoint on
// another node than the Pod's, fails the pause (the image, when it can be named, is
// deleted) and the Secret is not marked.
func TestPauseBadAgentAnswer(t *testing.T) {
	for i, c := range []struct {
		answer  NodeCheckpoint
		deleted []string
	}{
		{NodeCheckpoint{ID: "../../etc", Node: "node-1"}, nil},
		{NodeCheckpoint{ID: "c-other", Node: "node-2"}, []string{"c-other"}},
	} {
		id := fmt.Sprintf("p-ba%d", i)
		agent := &fakeNodeAgent{answer: &c.answer}
		b, cs, _, _ := pausable(t, gvisorSpec(id), agent)
		if _, err := b.Pause(t.Context(), id, true); err == nil {
			t.Errorf("%+v: Pause succeeded", c.answer)
		}
		if got := agent.deletedIDs(); !reflect.DeepEqual(got, c.deleted) {
			t.Errorf("%+v: deleted %v, want %v", c.answer, got, c.deleted)
		}
		if sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(id), metav1.GetOptions{}); err != nil || sec.Labels[labelPaused] != "" {
			t.Errorf("%+v: Secret %v (%v), want unmarked", c.answer, sec, err)
		}
	}
}

// TestTrackConnWhilePausing: a connection dialed while a pause began is closed and
// ErrPaused, never handed out (closeAgentConns may already have run).
func TestTrackConnWhilePausing(t *testing.T) {
	b, _, s, _ := pausable(t, gvisorSpec("p-tc"), &fakeNodeAgent{})
	b.mu.Lock()
	s.pausing = true
	b.mu.Unlock()
	mine, peer := net.Pipe()
	if c, err := b.trackConn(s, mine); !errors.Is(err, runtime.ErrPaused) || c != nil {
		t.Errorf("trackConn while pausing = %v, %v; want ErrPaused", c, err)
	}
	_ = peer.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the connection: read %v, want EOF (closed)", err)
	}
}

// TestPauseWaitsForAdoption: a Pause right after a Create waits for the Create's
// adoption of the Secrets by the Pod before it checkpoints (a late ownership patch would
// give them back to the Pod the pause deletes).
func TestPauseWaitsForAdoption(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, _, s, _ := pausable(t, gvisorSpec("p-ad"), agent)
	adopted := make(chan struct{})
	b.mu.Lock()
	s.adopted = adopted
	b.mu.Unlock()
	done := make(chan error, 1)
	go func() { _, err := b.Pause(t.Context(), "p-ad", true); done <- err }()
	time.Sleep(300 * time.Millisecond)
	agent.mu.Lock()
	early := len(agent.checkpoints)
	agent.mu.Unlock()
	if early != 0 {
		t.Error("the pause checkpointed before the Create's adoption ended")
	}
	close(adopted)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pause did not go on after the adoption")
	}
}

// TestResumeSucceeds: a restored Pod that gets an IP and whose agent answers resumes the
// sandbox: its Secret loses the paused marks, its Secret, pull Secret and NetworkPolicy
// belong to the new Pod, its new address is in the egress registry (host-name rules)
// before Resume returns, the image is deleted, DialAgent works again.
func TestResumeSucceeds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr, gs := startTestGate(t, ctx)
	agent := &fakeNodeAgent{}
	spec := hostNameSpec("p-ok", runtime.EgressRule{DNSName: "api.example.com"})
	spec.RuntimeClass = GVisorClass
	b, cs, s, _ := pausable(t, spec, agent, func(c *Config) {
		c.Egress = testEgress()
		c.StartTimeout = 10 * time.Second
		c.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) { return dialRetrying(ctx, addr) }
	})
	b.mu.Lock()
	s.client, s.server, s.ident = gs.client, gs.server, gs.ident
	b.mu.Unlock()
	if _, err := b.Pause(t.Context(), "p-ok", true); err != nil {
		t.Fatal(err)
	}
	newUID := types.UID("uid-restored")
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		p.UID = newUID
		p.Spec.NodeName = "node-1"
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.10"}
		return false, nil, nil
	})
	if _, err := b.Resume(t.Context(), "p-ok"); err != nil {
		t.Fatal(err)
	}
	if !b.EgressKnown(netip.MustParseAddr("10.0.0.10")) {
		t.Error("the resumed sandbox's new IP is not in the egress registry when Resume returns")
	}
	owned := func(refs []metav1.OwnerReference) bool { return len(refs) == 1 && refs[0].UID == newUID }
	sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-ok"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sec.Labels[labelPaused]; ok || sec.Annotations[annotationPausedCkpt] != "" || sec.Annotations[annotationPausedNode] != "" {
		t.Errorf("resumed sandbox's Secret still marked: %v %v", sec.Labels, sec.Annotations)
	}
	if !owned(sec.OwnerReferences) {
		t.Errorf("Secret owners %v, want the new Pod", sec.OwnerReferences)
	}
	pull, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), pullSecretName("p-ok"), metav1.GetOptions{})
	if err != nil || !owned(pull.OwnerReferences) {
		t.Errorf("pull Secret %v (%v), want owned by the new Pod", pull, err)
	}
	np, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), networkPolicyName("p-ok"), metav1.GetOptions{})
	if err != nil || !owned(np.OwnerReferences) {
		t.Errorf("NetworkPolicy %v (%v), want owned by the new Pod", np, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(agent.deletedIDs()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := agent.deletedIDs(); !reflect.DeepEqual(got, []string{"c-test-1"}) {
		t.Errorf("checkpoints deleted %v, want [c-test-1]", got)
	}
	b.mu.Lock()
	paused := s.paused != nil
	b.mu.Unlock()
	if paused {
		t.Error("still paused after Resume")
	}
	c, err := b.DialAgent(t.Context(), "p-ok", "")
	if err != nil {
		t.Errorf("DialAgent after Resume: %v", err)
	} else {
		c.Close()
	}
}

// madeSecret runs one Create of spec (as madePods) and returns the Pod and the sandbox
// Secret it made.
func madeSecret(t *testing.T, cfg Config, spec *runtime.Spec) (*corev1.Pod, *corev1.Secret) {
	t.Helper()
	b, cs := newFakeBackend(t, cfg)
	var mu sync.Mutex
	var pod *corev1.Pod
	var sec *corev1.Secret
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch o := a.(k8stesting.CreateAction).GetObject().(type) {
		case *corev1.Pod:
			pod = o.DeepCopy()
		case *corev1.Secret:
			if o.Name == secretName(spec.ID) {
				sec = o.DeepCopy()
			}
		}
		return false, nil, nil
	})
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ccancel()
	_, _ = b.Create(cctx, spec)
	mu.Lock()
	defer mu.Unlock()
	if pod == nil || sec == nil {
		t.Fatal("the Create made no Pod or Secret")
	}
	return pod, sec
}

// TestRecoverPaused: a restarted runner finds a paused sandbox (its Secret marked, no
// Pod) without the record of its paused Pod (pausestate.go; TestRecoverTakesPausedOver
// has one): it is reported ended with Reason CheckpointLost, its checkpoint is deleted
// through the node agent, its Secrets and NetworkPolicy are deleted. A Pod with the
// restore annotation whose Secret is still marked (a resume cut short): the marks go,
// the Pod owns the Secrets and NetworkPolicy, the image is deleted.
func TestRecoverPaused(t *testing.T) {
	cfg := Config{StartTimeout: time.Second, MaxPrepull: -1, NodeAgents: &fakeNodeAgent{},
		RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}}
	mark := func(sec *corev1.Secret, cid string) {
		sec.Labels[labelPaused] = "true"
		sec.Annotations = map[string]string{annotationPausedCkpt: cid, annotationPausedNode: "node-1",
			annotationPausedAt: "2026-12-07T12:00:00Z", annotationPausedBytes: "4096"}
	}
	om := func(name, id string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: "sbx", Labels: map[string]string{LabelSandbox: id}}
	}
	_, sec1 := madeSecret(t, cfg, gvisorSpec("p-r1"))
	mark(sec1, "c-lost-1")
	pod2, sec2 := madeSecret(t, cfg, gvisorSpec("p-r2"))
	mark(sec2, "c-resumed-2")
	pod2.UID = "uid-r2"
	pod2.Spec.NodeName = "node-1"
	pod2.Annotations[runtime.RestoreCheckpointAnnotation] = "c-resumed-2"
	pod2.Status = corev1.PodStatus{Phase: corev1.PodRunning}

	// Both checkpoints are the sandboxes' own (the node agent took them of their Pods).
	agent := &fakeNodeAgent{others: []NodeCheckpointEntry{
		{ID: "c-lost-1", SandboxID: "p-r1", Namespace: "sbx", Name: podName("p-r1"), UID: "uid-r1"},
		{ID: "c-resumed-2", SandboxID: "p-r2", Namespace: "sbx", Name: podName("p-r2"), UID: "uid-r2-paused"},
	}}
	cfg.NodeAgents = agent
	b, cs := newFakeBackend(t, cfg, sec1, sec2, pod2,
		&corev1.Secret{ObjectMeta: om(pullSecretName("p-r1"), "p-r1")},
		&networkingv1.NetworkPolicy{ObjectMeta: om(networkPolicyName("p-r1"), "p-r1")},
		&corev1.Secret{ObjectMeta: om(pullSecretName("p-r2"), "p-r2")},
		&networkingv1.NetworkPolicy{ObjectMeta: om(networkPolicyName("p-r2"), "p-r2")})
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var r1 *runtime.Recovered
	for i := range recs {
		if recs[i].Spec.ID == "p-r1" {
			r1 = &recs[i]
		}
	}
	if r1 == nil || r1.Alive || r1.Paused || r1.Exit == nil || r1.Exit.Reason != "CheckpointLost" {
		t.Errorf("recovered paused sandbox %+v, want ended with Reason CheckpointLost", r1)
	}
	for _, n := range []string{secretName("p-r1"), pullSecretName("p-r1")} {
		if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("paused sandbox's %s after Recover: %v, want deleted", n, err)
		}
	}
	if _, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), networkPolicyName("p-r1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("paused sandbox's NetworkPolicy after Recover: %v, want deleted", err)
	}
	got := agent.deletedIDs()
	slices.Sort(got)
	if !reflect.DeepEqual(got, []string{"c-lost-1", "c-resumed-2"}) {
		t.Errorf("checkpoints deleted %v, want [c-lost-1 c-resumed-2]", got)
	}
	s2, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-r2"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Labels[labelPaused]; ok || s2.Annotations[annotationPausedCkpt] != "" {
		t.Errorf("interrupted resume's Secret still marked: %v %v", s2.Labels, s2.Annotations)
	}
	owned := func(refs []metav1.OwnerReference) bool { return len(refs) == 1 && refs[0].UID == "uid-r2" }
	if !owned(s2.OwnerReferences) {
		t.Errorf("interrupted resume's Secret owners %v, want its Pod", s2.OwnerReferences)
	}
	if p, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), pullSecretName("p-r2"), metav1.GetOptions{}); err != nil || !owned(p.OwnerReferences) {
		t.Errorf("interrupted resume's pull Secret %v (%v), want owned by its Pod", p, err)
	}
	if np, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), networkPolicyName("p-r2"), metav1.GetOptions{}); err != nil || !owned(np.OwnerReferences) {
		t.Errorf("interrupted resume's NetworkPolicy %v (%v), want owned by its Pod", np, err)
	}
}

// TestResumePodAsCreated: the resumed Pod is the one a real Create made (a policy's
// annotations and pull Secrets, the caller's and org's labels, the sandbox's own pull
// credentials, host-name egress rules, a custom security context): same labels,
// annotations (plus the restore one), pull Secrets, volumes and containers, except that
// a container pulled with the sandbox's credentials (PullAlways) runs the image digest
// the paused Pod ran, IfNotPresent (the credentials may have expired by the resume; the
// Pod is pinned to the same node). Without that digest the pause is refused.
func TestResumePodAsCreated(t *testing.T) {
	uid := uint32(1000)
	spec := hostNameSpec("p-full", runtime.EgressRule{DNSName: "api.example.com"})
	spec.RuntimeClass = GVisorClass
	spec.Image = "reg.example/app:1"
	spec.Command, spec.Args = "sleep", []string{"600"}
	spec.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
	spec.Security = &runtime.Security{RunAsUser: &uid, CapDrop: []string{"ALL"}}
	spec.Pod = &runtime.PodSettings{Annotations: map[string]string{"team": "a"}, ImagePullSecrets: []string{"policy-pull"}}
	spec.Meta = map[string]string{runtime.MetaOrg: "org-a", runtime.MetaCaller: "key-1"}
	egress := func(c *Config) { c.Egress = testEgress() }
	const digest = "reg.example/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

	// Without the image's digest in the Pod's status: refused.
	bn, _, _, _ := pausable(t, spec, &fakeNodeAgent{}, egress)
	if _, err := bn.Pause(t.Context(), "p-full", true); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "digest") {
		t.Errorf("Pause of a sandbox with pull credentials and no image digest: %v, want refused naming the digest", err)
	}

	agent := &fakeNodeAgent{}
	b, cs, s, pod := pausable(t, spec, agent, egress)
	var main *corev1.Container
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name == containerMain {
			main = c
		}
		id := "docker.io/library/agent@sha256:" + strings.Repeat("a", 64)
		if c.Name == containerMain {
			id = digest
		}
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, ImageID: id})
	}
	if main == nil || main.ImagePullPolicy != corev1.PullAlways {
		t.Fatalf("Create's main container %+v: want PullAlways (pull credentials)", main)
	}
	if len(pod.Spec.ImagePullSecrets) < 2 || main.SecurityContext == nil || pod.Annotations["team"] != "a" || pod.Labels[LabelOrg] != "org-a" {
		t.Fatalf("Create's Pod lacks what the test needs: pull %v, annotations %v, labels %v", pod.Spec.ImagePullSecrets, pod.Annotations, pod.Labels)
	}
	if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	s.pod = pod
	b.mu.Unlock()
	if _, err := b.Pause(t.Context(), "p-full", true); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var made *corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		made = a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		mu.Unlock()
		return false, nil, nil
	})
	if _, err := b.Resume(t.Context(), "p-full"); err == nil {
		t.Fatal("Resume without a kubelet succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if made == nil {
		t.Fatal("Resume made no Pod")
	}
	if !maps.Equal(made.Labels, pod.Labels) {
		t.Errorf("resumed Pod labels %v, Create's %v", made.Labels, pod.Labels)
	}
	wantAnn := maps.Clone(pod.Annotations)
	wantAnn[runtime.RestoreCheckpointAnnotation] = "c-test-1"
	if !maps.Equal(made.Annotations, wantAnn) {
		t.Errorf("resumed Pod annotations %v, want %v", made.Annotations, wantAnn)
	}
	if !reflect.DeepEqual(made.Spec.ImagePullSecrets, pod.Spec.ImagePullSecrets) {
		t.Errorf("resumed Pod pull Secrets %v, Create's %v", made.Spec.ImagePullSecrets, pod.Spec.ImagePullSecrets)
	}
	if !reflect.DeepEqual(made.Spec.Volumes, pod.Spec.Volumes) {
		t.Errorf("resumed Pod volumes differ:\n%+v\n%+v", made.Spec.Volumes, pod.Spec.Volumes)
	}
	want := make([]corev1.Container, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		c = *c.DeepCopy()
		if c.ImagePullPolicy == corev1.PullAlways {
			c.Image, c.ImagePullPolicy = pod.Status.ContainerStatuses[i].ImageID, corev1.PullIfNotPresent
		}
		want[i] = c
	}
	if !reflect.DeepEqual(made.Spec.Containers, want) {
		t.Errorf("resumed Pod's containers:\n%+v\nwant\n%+v", made.Spec.Containers, want)
	}
	for _, c := range made.Spec.Containers {
		if c.Name == containerMain && (c.Image != digest || c.ImagePullPolicy != corev1.PullIfNotPresent) {
			t.Errorf("resumed main container image %s %s, want %s IfNotPresent", c.Image, c.ImagePullPolicy, digest)
		}
	}
}

// TestPauseStoppedDuringCheckpoint: a Stop that came while the checkpoint ran ends the
// pause: the image is deleted, the Secret is not marked paused.
func TestPauseStoppedDuringCheckpoint(t *testing.T) {
	agent := &fakeNodeAgent{}
	b, cs, s, _ := pausable(t, gvisorSpec("p-st"), agent)
	agent.onCheckpoint = func(NodeCheckpointRequest) error {
		b.mu.Lock()
		s.stopping = true
		b.mu.Unlock()
		return nil
	}
	if _, err := b.Pause(t.Context(), "p-st", true); err == nil {
		t.Fatal("a pause whose sandbox was stopped during the checkpoint succeeded")
	}
	if got := agent.deletedIDs(); !reflect.DeepEqual(got, []string{"c-test-1"}) {
		t.Errorf("checkpoints deleted %v, want [c-test-1]", got)
	}
	if sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-st"), metav1.GetOptions{}); err != nil || sec.Labels[labelPaused] != "" {
		t.Errorf("Secret %v (%v), want not marked paused", sec, err)
	}
}

// TestResumeKeepsWarmClaim: a sandbox claimed from the warm pool keeps its claim's time
// (its start) on the resumed Pod.
func TestResumeKeepsWarmClaim(t *testing.T) {
	b, cs, s, pod := pausable(t, gvisorSpec("p-wc"), &fakeNodeAgent{})
	b.mu.Lock()
	s.pod = pod.DeepCopy()
	s.pod.Annotations[annotationWarmClaimed] = "2026-12-07T12:00:00Z"
	b.mu.Unlock()
	if _, err := b.Pause(t.Context(), "p-wc", true); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var made *corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		made = a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		mu.Unlock()
		return false, nil, nil
	})
	_, _ = b.Resume(t.Context(), "p-wc")
	mu.Lock()
	defer mu.Unlock()
	if made == nil || made.Annotations[annotationWarmClaimed] != "2026-12-07T12:00:00Z" {
		t.Errorf("resumed Pod %v, want the warm claim's annotation", made)
	}
}

// TestPausedIgnoresOldPod: a paused sandbox without a restored Pod takes no event of
// the Pod the pause deleted (a late update, its deletion) for its own.
func TestPausedIgnoresOldPod(t *testing.T) {
	b, _, s, pod := pausable(t, gvisorSpec("p-old"), &fakeNodeAgent{})
	if _, err := b.Pause(t.Context(), "p-old", true); err != nil {
		t.Fatal(err)
	}
	old := pod.DeepCopy()
	old.Status.Phase = corev1.PodFailed
	b.observe(old, false)
	b.observe(old, true)
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.pod != nil || s.deleted {
		t.Errorf("paused sandbox took the deleted Pod's events: pod %v, deleted %v", s.pod != nil, s.deleted)
	}
}
