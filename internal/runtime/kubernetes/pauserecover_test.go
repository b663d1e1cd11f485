package kubernetes

import (
	"encoding/json"
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

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

const (
	recoverDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	recoverStart  = "2026-12-07T11:00:00Z"
)

// recoverSpec is a gvisor sandbox with what the resumed Pod takes from the paused one:
// pull credentials (its image pulled Always: pinned), a security context with capability
// drops and a run-as user, a policy's annotations and pull Secret, an organization and a
// caller.
func recoverSpec(id string) *runtime.Spec {
	uid := uint32(1000)
	return &runtime.Spec{ID: id, RuntimeClass: GVisorClass,
		Container: runtime.Container{Image: "reg.example/app:1", Command: "sleep", Args: []string{"600"},
			PullCredentials: &runtime.Credentials{Username: "u", Password: "p"},
			Security:        &runtime.Security{RunAsUser: &uid, CapDrop: []string{"ALL"}}},
		Pod:  &runtime.PodSettings{Annotations: map[string]string{"team": "a"}, ImagePullSecrets: []string{"policy-pull"}},
		Meta: map[string]string{runtime.MetaOrg: "org-a", runtime.MetaCaller: "key-1"},
	}
}

func recoverCfg(agent *fakeNodeAgent) Config {
	return Config{StartTimeout: time.Second, MaxPrepull: -1, NodeAgents: agent,
		HelloListen: "127.0.0.1:0", HelloAddr: "10.0.0.1:7444",
		RuntimeClasses: map[string]string{"runc": "", GVisorClass: "gvisor"}}
}

// pausedBeforeRestart is a sandbox a real Create made for spec (its Pod running on
// node-1, its Secret, pull Secret and NetworkPolicy owned by the Pod), paused by a first
// Backend on the fake API server it returns; want is the Pod that Backend's Resume would
// make. The first Backend is closed (the runner stopped).
func pausedBeforeRestart(t *testing.T, spec *runtime.Spec, agent *fakeNodeAgent) (cs *fake.Clientset, want *corev1.Pod) {
	t.Helper()
	cfg := recoverCfg(agent)
	pod, sec := madeSecret(t, cfg, spec)
	pod.UID = types.UID("uid-" + spec.ID)
	pod.Spec.NodeName = "node-1"
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9"}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name,
			ImageID: "reg.example/other-name@" + recoverDigest, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)}}})
	}
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	sec.OwnerReferences = owner
	om := metav1.ObjectMeta{Namespace: "sbx", OwnerReferences: owner, Labels: map[string]string{LabelSandbox: spec.ID}}
	pull, np := &corev1.Secret{ObjectMeta: om}, &networkingv1.NetworkPolicy{ObjectMeta: om}
	pull.Name, np.Name = pullSecretName(spec.ID), networkPolicyName(spec.ID)
	b1, cs := newFakeBackend(t, cfg, pod, sec, pull, np)
	s, err := sandboxFromSecret(spec.ID, sec)
	if err != nil {
		t.Fatal(err)
	}
	s.helloKey = sec.Data[gate.HelloKeyFile] // as its Create left it
	if len(s.helloKey) == 0 {
		t.Fatal("the Create's Secret has no hello key: the test needs one")
	}
	s.pod, s.uid = pod, pod.UID
	b1.mu.Lock()
	b1.sandboxes[spec.ID] = s
	b1.mu.Unlock()
	if _, err := b1.Pause(t.Context(), spec.ID, true); err != nil {
		t.Fatal(err)
	}
	b1.mu.Lock()
	ps := s.paused
	b1.mu.Unlock()
	if want, err = b1.resumePod(s, ps); err != nil {
		t.Fatal(err)
	}
	b1.Close()
	return cs, want
}

// recovered is the Recovered of id in recs (nil: none).
func recovered(recs []runtime.Recovered, id string) *runtime.Recovered {
	for i := range recs {
		if recs[i].Spec.ID == id {
			return &recs[i]
		}
	}
	return nil
}

// madeOnResume runs b's Resume of id (there is no kubelet: it fails once StartTimeout
// has passed) and returns the Pod it made.
func madeOnResume(t *testing.T, b *Backend, cs *fake.Clientset, id string) *corev1.Pod {
	t.Helper()
	var mu sync.Mutex
	var made *corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		mu.Lock()
		made = a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		mu.Unlock()
		return false, nil, nil
	})
	if _, err := b.Resume(t.Context(), id); err == nil {
		t.Fatal("Resume without a kubelet succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if made == nil {
		t.Fatal("Resume made no Pod")
	}
	return made
}

// TestRecoverTakesPausedOver: a runner restarted while a sandbox was paused reports it
// paused (checkpointed: Paused and Released, its image digest and start), and its
// Resume makes the very Pod the runner that paused it would have made (labels,
// annotations with the checkpoint, pull Secrets, security context, the image pinned to
// its digest in the spec's repository, the gate's hello); a resume that fails leaves it
// paused; its Destroy deletes its checkpoint and Secrets.
func TestRecoverTakesPausedOver(t *testing.T) {
	agent := &fakeNodeAgent{}
	cs, want := pausedBeforeRestart(t, recoverSpec("p-take"), agent)
	for _, c := range want.Spec.Containers {
		if c.Name == containerMain && c.Image != "reg.example/app@"+recoverDigest {
			t.Fatalf("the first runner's resumed main image %q, want the spec's repository at the digest", c.Image)
		}
	}
	b2 := backendOn(t, recoverCfg(agent), cs)
	recs, err := b2.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := recovered(recs, "p-take")
	if r == nil || !r.Paused || !r.Released || r.Alive || r.Exit != nil {
		t.Fatalf("recovered %+v, want paused (released)", r)
	}
	if r.Info.ImageDigest != recoverDigest || !r.Info.StartedAt.Equal(time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)) || r.Info.RuntimeClass != GVisorClass {
		t.Errorf("recovered info %+v, want the paused Pod's digest, start and class", r.Info)
	}
	if got := agent.deletedIDs(); len(got) != 0 {
		t.Errorf("checkpoints deleted at recover: %v, want none", got)
	}
	if _, err := b2.DialAgent(t.Context(), "p-take", ""); err == nil || !strings.Contains(err.Error(), runtime.ErrPaused.Error()) {
		t.Errorf("DialAgent of the recovered paused sandbox: %v, want ErrPaused", err)
	}
	made := madeOnResume(t, b2, cs, "p-take")
	if !reflect.DeepEqual(made.Labels, want.Labels) || !reflect.DeepEqual(made.Annotations, want.Annotations) {
		t.Errorf("resumed Pod's metadata after the restart:\n%v %v\nbefore:\n%v %v", made.Labels, made.Annotations, want.Labels, want.Annotations)
	}
	if !reflect.DeepEqual(made.Spec, want.Spec) {
		t.Errorf("resumed Pod's spec after the restart differs:\n%+v\nbefore:\n%+v", made.Spec, want.Spec)
	}
	b2.mu.Lock()
	paused := b2.sandboxes["p-take"] != nil && b2.sandboxes["p-take"].paused != nil
	b2.mu.Unlock()
	if !paused {
		t.Fatal("a failed resume of the recovered sandbox left it not paused")
	}
	if err := b2.Destroy(t.Context(), "p-take"); err != nil {
		t.Fatal(err)
	}
	if got := agent.deletedIDs(); !slices.Contains(got, "c-test-1") {
		t.Errorf("checkpoints deleted by Destroy: %v, want c-test-1", got)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-take"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret after Destroy: %v, want deleted", err)
	}
}

// TestRecoverPausedBadRecord: a paused sandbox's Secret whose record is missing,
// oversized, of another version or shape, or names what this runner would not make for
// its spec (another pull Secret, a pin of a container pulled from cache, a bad digest, an unknown
// container, a bad checkpoint ID or node) ends it at Recover: Reason CheckpointLost, the
// message naming what is wrong; its checkpoint and Secrets are deleted.
func TestRecoverPausedBadRecord(t *testing.T) {
	edit := func(f func(m map[string]any)) func(a map[string]string) {
		return func(a map[string]string) {
			var m map[string]any
			if err := json.Unmarshal([]byte(a[annotationPausedPod]), &m); err != nil {
				panic(err)
			}
			f(m)
			b, _ := json.Marshal(m)
			a[annotationPausedPod] = string(b)
		}
	}
	for _, tc := range []struct {
		name, want string
		tamper     func(a map[string]string)
	}{
		{"missing", "no " + annotationPausedPod, func(a map[string]string) { delete(a, annotationPausedPod) }},
		{"oversized", "more than", edit(func(m map[string]any) { m["warm_claimed"] = strings.Repeat("x", maxPausedPodBytes) })},
		{"not json", annotationPausedPod, func(a map[string]string) { a[annotationPausedPod] = "{" }},
		{"trailing", "after the object", func(a map[string]string) { a[annotationPausedPod] += "{}" }},
		{"version", "version 2", edit(func(m map[string]any) { m["v"] = 2 })},
		{"unknown field", "unknown field", edit(func(m map[string]any) { m["host_network"] = true })},
		{"pull secret", "pull Secret", edit(func(m map[string]any) { m["pull_secrets"] = []string{"sbx-other-pull"} })},
		{"many pull secrets", "more than", edit(func(m map[string]any) {
			m["pull_secrets"] = []string{"a", "b", "c", "d", "e"}
		})},
		{"pin from cache", "not pulled every time", edit(func(m map[string]any) {
			m["pinned"].(map[string]any)[containerGate] = recoverDigest
		})},
		{"bad digest", "sha256", edit(func(m map[string]any) { m["pinned"].(map[string]any)[containerMain] = "sha256:xyz" })},
		{"unknown container", "does not have", edit(func(m map[string]any) {
			m["pull_policy"].(map[string]any)["evil"] = "Always"
		})},
		{"started after pause", "started_at", edit(func(m map[string]any) { m["started_at"] = "2099-01-01T00:00:00Z" })},
		{"checkpoint id", annotationPausedCkpt, func(a map[string]string) { a[annotationPausedCkpt] = "../../etc" }},
		{"node", annotationPausedNode, func(a map[string]string) { a[annotationPausedNode] = "Node_1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := &fakeNodeAgent{}
			cs, _ := pausedBeforeRestart(t, recoverSpec("p-bad"), agent)
			sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-bad"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tc.tamper(sec.Annotations)
			if _, err := cs.CoreV1().Secrets("sbx").Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			b2 := backendOn(t, recoverCfg(agent), cs)
			recs, err := b2.Recover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			r := recovered(recs, "p-bad")
			if r == nil || r.Paused || r.Alive || r.Exit == nil || r.Exit.Reason != "CheckpointLost" || !strings.Contains(r.Exit.Message, tc.want) {
				t.Fatalf("recovered %+v, want ended with Reason CheckpointLost naming %q", r, tc.want)
			}
			// A bad checkpoint ID or node name is not asked for (nor deleted).
			if tc.name != "checkpoint id" && tc.name != "node" && !slices.Contains(agent.deletedIDs(), "c-test-1") {
				t.Errorf("checkpoints deleted %v, want c-test-1", agent.deletedIDs())
			}
			if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName("p-bad"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Secret: %v, want deleted", err)
			}
		})
	}
}

// TestRecoverFinishesInterruptedPause: a runner stopped after a pause marked the Secret
// but before the checkpointed Pod was deleted (and before the Pod's ownership came off
// the pull Secret and NetworkPolicy): the restarted runner takes the ownership off,
// deletes the Pod and takes the sandbox over paused; its checkpoint is kept.
func TestRecoverFinishesInterruptedPause(t *testing.T) {
	agent := &fakeNodeAgent{}
	cs, _ := pausedBeforeRestart(t, recoverSpec("p-int"), agent)
	// The Pod the pause would have deleted, its processes ended by the checkpoint.
	pod := sandboxPodOn(t, cs, "p-int", "uid-p-int", corev1.PodFailed)
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	pull, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), pullSecretName("p-int"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pull.OwnerReferences = owner
	if _, err := cs.CoreV1().Secrets("sbx").Update(t.Context(), pull, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b2 := backendOn(t, recoverCfg(agent), cs)
	recs, err := b2.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r := recovered(recs, "p-int"); r == nil || !r.Paused || !r.Released || r.Exit != nil {
		t.Fatalf("recovered %+v, want paused", r)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName("p-int"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the checkpointed Pod after Recover: %v, want deleted", err)
	}
	if p, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), pullSecretName("p-int"), metav1.GetOptions{}); err != nil || len(p.OwnerReferences) != 0 {
		t.Errorf("pull Secret %v (%v), want kept, owned by nothing", p, err)
	}
	if got := agent.deletedIDs(); len(got) != 0 {
		t.Errorf("checkpoints deleted %v, want none", got)
	}
}

// sandboxPodOn creates on cs the Pod of sandbox id this runner (r1) left on node-1 with
// uid and phase (a pause cut short before its Pod was deleted, or a running one).
func sandboxPodOn(t *testing.T, cs *fake.Clientset, id string, uid types.UID, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: uid,
		Labels: map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: id, LabelRunner: "r1"}},
		Spec:   corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: containerMain, Image: "reg.example/app:1"}}},
		Status: corev1.PodStatus{Phase: phase}}
	if _, err := cs.CoreV1().Pods("sbx").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}
