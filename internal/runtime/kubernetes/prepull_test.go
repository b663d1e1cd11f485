package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

func target(key, org string, pod *runtime.PodSettings, images ...string) runtime.WarmTarget {
	t := runtime.WarmTarget{Key: org + "/" + key, Spec: runtime.Spec{Meta: map[string]string{runtime.MetaOrg: org}, Pod: pod}}
	t.Spec.Container = runtime.Container{Image: images[0]}
	for i, im := range images[1:] {
		t.Spec.Sidecars = append(t.Spec.Sidecars, runtime.Container{Name: fmt.Sprintf("s%d", i), Image: im})
	}
	return t
}

// TestPrepullWants: images of every container, deduplicated by reference (and by the
// organization whose token pulls it), in target order, bounded; the Pod settings of
// every target wanting an image are kept.
func TestPrepullWants(t *testing.T) {
	b := &Backend{cfg: Config{PlatformRegistry: testRegistry}}
	exp := time.Now().Add(15 * time.Minute)
	priv := testRegistry + "/org-a/app:1"
	gpu := &runtime.PodSettings{NodeSelector: map[string]string{"gpu": "yes"}}
	ta := target("t1", "org-a", nil, "busybox", "python:3")
	ta.Spec.InitContainers = []runtime.Container{{Name: "i", Image: "busybox"}}
	tb := target("t2", "org-a", gpu, "python:3", priv)
	tb.Spec.Sidecars[0].PullCredentials = testCreds("org-a", exp)
	tc := target("t3", "org-b", nil, priv) // org-b's token would not read it: its own want
	tc.Spec.Container.PullCredentials = testCreds("org-b", exp)
	td := target("t4", "org-b", nil, "ghcr.io/x/y:1")
	td.Spec.Container.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}

	ws, dropped := b.prepullWants([]runtime.WarmTarget{ta, tb, tc, td}, 64)
	var refs []string
	for _, w := range ws {
		refs = append(refs, w.ref)
	}
	if want := []string{"busybox", "python:3", priv, priv, "ghcr.io/x/y:1"}; !slices.Equal(refs, want) || dropped != 0 {
		t.Fatalf("wants %v (dropped %d), want %v", refs, dropped, want)
	}
	if len(ws[1].pods) != 2 || ws[1].pods[0] != nil || ws[1].pods[1].NodeSelector["gpu"] != "yes" {
		t.Errorf("python:3's placements: %v", ws[1].pods)
	}
	if ws[2].orgTok == nil || ws[2].orgTok.org != "org-a" || ws[3].orgTok == nil || ws[3].orgTok.org != "org-b" || ws[2].creds != nil {
		t.Errorf("org tokens: %+v %+v", ws[2].orgTok, ws[3].orgTok)
	}
	if ws[4].creds == nil || ws[4].orgTok != nil {
		t.Errorf("own credentials: %+v", ws[4])
	}
	ws, dropped = b.prepullWants([]runtime.WarmTarget{ta, tb, tc, td}, 2)
	if len(ws) != 2 || dropped != 3 {
		t.Errorf("bound 2: %d wants, %d dropped", len(ws), dropped)
	}
}

func node(name string, ready bool, mod func(*corev1.Node)) *corev1.Node {
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	if mod != nil {
		mod(n)
	}
	return n
}

func fastPrepull(b *Backend) {
	p := b.prepull
	p.tick, p.nodeEvery, p.retryMin, p.retryMax = 10*time.Millisecond, 20*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond
}

// prepullPods lists the runner's pre-pull Pods, by name.
func prepullPods(t *testing.T, cs *fake.Clientset) []corev1.Pod {
	t.Helper()
	l, err := cs.CoreV1().Pods("sbx").List(context.Background(), metav1.ListOptions{LabelSelector: LabelKind + "=" + KindPrepull})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

func setPodStatus(t *testing.T, cs *fake.Clientset, pod *corev1.Pod, st corev1.PodStatus) {
	t.Helper()
	pod.Status = st
	if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestPrepullNodes: a pre-pull Pod per image and eligible node (schedulable, Ready,
// allowed by the target's node selector and tolerations), never more than the in-flight
// bound at once, pinned to its node, running the no-op from the agent image, pulling
// with the organization's Secret (Always); a Pod that Succeeded is deleted and marks
// the image present; a failed pull is retried after the backoff; images no longer
// wanted lose their Pods, and the organization its Secret.
func TestPrepullNodes(t *testing.T) {
	nodes := []k8sruntime.Object{
		node("n1", true, nil),
		node("n2", true, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}}
		}),
		node("n3", true, func(n *corev1.Node) { n.Spec.Unschedulable = true }),
		node("n4", false, nil),
		node("n5", true, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "other", Effect: corev1.TaintEffectNoExecute}}
		}),
		node("n6", true, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "soft", Effect: corev1.TaintEffectPreferNoSchedule}}
		}),
	}
	b, cs := newFakeBackend(t, Config{PrepullInFlight: 2}, nodes...)
	fastPrepull(b)
	exp := time.Now().Add(15 * time.Minute)
	priv := testRegistry + "/org-a/app:1"
	tol := &runtime.PodSettings{Tolerations: []runtime.Toleration{{Key: "gpu", Operator: "Exists"}}, ImagePullSecrets: []string{"operator"}}
	ta := target("t1", "org-a", tol, priv)
	ta.Spec.Container.PullCredentials = testCreds("org-a", exp)
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{ta}); err != nil {
		t.Fatal(err)
	}
	// n1, n2 (tolerated), n6 (PreferNoSchedule): three Pods, at most two at a time.
	done := map[string]bool{}
	for len(done) < 3 {
		var pods []corev1.Pod
		eventually(t, "pre-pull pods", func() bool {
			pods = prepullPods(t, cs)
			n := 0
			for _, p := range pods {
				if !done[p.Spec.NodeName] {
					n++
				}
			}
			return n > 0
		})
		if len(pods) > 2 {
			t.Fatalf("%d pre-pull Pods at once, bound 2", len(pods))
		}
		for i := range pods {
			p := &pods[i]
			if done[p.Spec.NodeName] {
				continue
			}
			checkPrepullPod(t, b, p, priv)
			done[p.Spec.NodeName] = true
			setPodStatus(t, cs, p, corev1.PodStatus{Phase: corev1.PodSucceeded})
		}
	}
	if !done["n1"] || !done["n2"] || !done["n6"] || len(done) != 3 {
		t.Errorf("pre-pulled onto %v, want n1 n2 n6", done)
	}
	eventually(t, "succeeded pods deleted", func() bool { return len(prepullPods(t, cs)) == 0 })
	eventually(t, "status", func() bool { st := b.PrepullStatus(); return st.Present == 3 && st.Images == 1 })
	orgSecret := OrgPullSecretName("r1", "org-a")
	if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), orgSecret, metav1.GetOptions{}); err != nil {
		t.Fatalf("org-a's pull secret: %v", err)
	}
	time.Sleep(150 * time.Millisecond)
	if n := len(prepullPods(t, cs)); n != 0 {
		t.Errorf("%d Pods again before the refresh", n)
	}

	// A second image without credentials on node n1 only (selector): a failed pull is
	// deleted and retried after the backoff.
	n1only := &runtime.PodSettings{NodeSelector: map[string]string{"kubernetes.io/hostname": "n1"}}
	node1, _ := cs.CoreV1().Nodes().Get(t.Context(), "n1", metav1.GetOptions{})
	node1.Labels["kubernetes.io/hostname"] = "n1"
	if _, err := cs.CoreV1().Nodes().Update(t.Context(), node1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tb := target("t2", "org-b", n1only, "busybox:1")
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{ta, tb}); err != nil {
		t.Fatal(err)
	}
	var first corev1.Pod
	eventually(t, "busybox pre-pull pod", func() bool {
		for _, p := range prepullPods(t, cs) {
			if p.Spec.Containers[0].Image == "busybox:1" {
				first = p
				return true
			}
		}
		return false
	})
	if first.Spec.NodeName != "n1" || first.Spec.NodeSelector["kubernetes.io/hostname"] != "n1" || len(first.Spec.ImagePullSecrets) != 0 ||
		first.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("busybox pod: node %s selector %v secrets %v policy %s", first.Spec.NodeName, first.Spec.NodeSelector, first.Spec.ImagePullSecrets, first.Spec.Containers[0].ImagePullPolicy)
	}
	setPodStatus(t, cs, &first, corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: containerPull,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found"}}}}})
	eventually(t, "failed pod deleted", func() bool { return len(prepullPods(t, cs)) == 0 })
	eventually(t, "failing in status", func() bool { return b.PrepullStatus().Failing == 1 })
	eventually(t, "retry after the backoff", func() bool { return len(prepullPods(t, cs)) == 1 })

	// Nothing wanted: the Pods and org-a's Secret go (no sandbox of org-a).
	if err := b.SetWarmPools(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pods of unwanted images deleted", func() bool { return len(prepullPods(t, cs)) == 0 })
	if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), orgSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("org-a's pull secret with nothing of org-a left: %v", err)
	}
}

func checkPrepullPod(t *testing.T, b *Backend, p *corev1.Pod, ref string) {
	t.Helper()
	s := p.Spec
	if s.NodeName == "" || s.RestartPolicy != corev1.RestartPolicyNever || s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken ||
		s.ActiveDeadlineSeconds == nil || p.Labels[LabelRunner] != "r1" || p.Labels[LabelOrg] != "org-a" || p.Labels[LabelSandbox] != "" {
		t.Errorf("pod %s: %+v labels %v", p.Name, s, p.Labels)
	}
	if len(s.InitContainers) != 1 || s.InitContainers[0].Image != b.cfg.AgentImage || len(s.Containers) != 1 {
		t.Fatalf("pod %s containers: %+v / %+v", p.Name, s.InitContainers, s.Containers)
	}
	c := s.Containers[0]
	if c.Image != ref || strings.Join(c.Command, " ") != gate.GatePath+" noop" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("pull container: %s %v %s", c.Image, c.Command, c.ImagePullPolicy)
	}
	for _, ct := range append(s.InitContainers, c) {
		sc := ct.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0 ||
			ct.Resources.Limits.Memory().IsZero() || ct.Resources.Requests.Cpu().MilliValue() > 10 {
			t.Errorf("container %s: security %+v resources %+v", ct.Name, sc, ct.Resources)
		}
	}
	var secrets []string
	for _, r := range s.ImagePullSecrets {
		secrets = append(secrets, r.Name)
	}
	if want := OrgPullSecretName("r1", "org-a") + ",operator"; strings.Join(secrets, ",") != want {
		t.Errorf("pull secrets %v, want %s", secrets, want)
	}
	if len(s.Tolerations) != 1 || s.Tolerations[0].Key != "gpu" {
		t.Errorf("tolerations %v", s.Tolerations)
	}
}

// TestPrepullCleanup: Pods and Secrets of an earlier process (by label) are deleted by
// Recover; other runners' are not.
func TestPrepullCleanup(t *testing.T) {
	lbl := func(runner string) map[string]string {
		return map[string]string{LabelManagedBy: ManagedBy, LabelRunner: runner, LabelKind: KindPrepull}
	}
	objs := []k8sruntime.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-prepull-old", Namespace: "sbx", Labels: lbl("r1")}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-prepull-other", Namespace: "sbx", Labels: lbl("r2")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sbx-prepull-olds", Namespace: "sbx", Labels: lbl("r1")}},
	}
	b, cs := newFakeBackend(t, Config{}, objs...)
	if _, err := b.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), "sbx-prepull-old", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("old pre-pull pod: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), "sbx-prepull-olds", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("old pre-pull secret: %v", err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), "sbx-prepull-other", metav1.GetOptions{}); err != nil {
		t.Errorf("another runner's pod: %v", err)
	}
}

// TestPrepullDisabled: MaxPrepull < 0 keeps nothing.
func TestPrepullDisabled(t *testing.T) {
	b, cs := newFakeBackend(t, Config{MaxPrepull: -1}, node("n1", true, nil))
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{target("t", "org-a", nil, "busybox")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(prepullPods(t, cs)); n != 0 {
		t.Errorf("%d pods with pre-pull disabled", n)
	}
}

var _ runtime.WarmPooler = (*Backend)(nil)

// TestPrepullRefreshesOrgSecret: every warm-target send refreshes the organizations'
// Secrets with the newest token it carries (no Pod needed: no nodes here).
func TestPrepullRefreshesOrgSecret(t *testing.T) {
	b, cs := newFakeBackend(t, Config{})
	fastPrepull(b)
	priv := testRegistry + "/org-a/app:1"
	holds := func(creds *runtime.Credentials) bool {
		sec, err := cs.CoreV1().Secrets("sbx").Get(context.Background(), OrgPullSecretName("r1", "org-a"), metav1.GetOptions{})
		return err == nil && strings.Contains(string(sec.Data[corev1.DockerConfigJsonKey]), creds.Password)
	}
	exp := time.Now().Add(15 * time.Minute)
	for i, c := range []*runtime.Credentials{testCreds("org-a", exp), testCreds("org-a", exp.Add(2*time.Minute))} {
		ta := target("t1", "org-a", nil, priv)
		ta.Spec.Container.PullCredentials = c
		if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{ta}); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("token %d in org-a's secret", i), func() bool { return holds(c) })
	}
}

// TestPrepullReport: per image, the nodes it is wanted on and present on; PULLING while
// its Pods run, FAILED with the kubelet's reason (clipped) when a node's Pod failed,
// PRESENT once every node has it (the error cleared).
func TestPrepullReport(t *testing.T) {
	b, cs := newFakeBackend(t, Config{PrepullInFlight: 2}, node("n1", true, nil), node("n2", true, nil), node("n3", false, nil))
	fastPrepull(b)
	b.prepull.retryMin, b.prepull.retryMax = time.Hour, time.Hour
	if err := b.SetWarmPools(t.Context(), []runtime.WarmTarget{target("t1", "org-a", nil, "busybox:1")}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	eventually(t, "two pre-pull pods", func() bool { pods = prepullPods(t, cs); return len(pods) == 2 })
	r := b.PrepullReport()
	if len(r.Images) != 1 || r.LeftOut != 0 {
		t.Fatalf("report %+v", r)
	}
	if i := r.Images[0]; i.Image != "busybox:1" || i.Target != "org-a/t1" || i.State != runtime.PrepullPulling || i.NodesTotal != 2 || i.NodesPresent != 0 || i.LastAttempt.IsZero() {
		t.Fatalf("while pulling: %+v", i)
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "n1" {
			setPodStatus(t, cs, p, corev1.PodStatus{Phase: corev1.PodSucceeded})
			continue
		}
		setPodStatus(t, cs, p, corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: containerPull,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "pull access denied " + strings.Repeat("x", 4096)}}}}})
	}
	eventually(t, "FAILED on n2", func() bool { return b.PrepullReport().Images[0].State == runtime.PrepullFailed })
	i := b.PrepullReport().Images[0]
	if i.NodesPresent != 1 || i.NodesTotal != 2 || !strings.HasPrefix(i.LastError, "ErrImagePull: pull access denied") ||
		len(i.LastError) > runtime.MaxPrepullErrorLen || i.NextAttempt.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("after a failure on n2: %+v (error %d bytes)", i, len(i.LastError))
	}

	// The retry on n2 succeeds.
	b.prepull.mu.Lock()
	for _, st := range b.prepull.state["busybox:1"] {
		if !st.present {
			st.due = time.Now()
		}
	}
	b.prepull.mu.Unlock()
	eventually(t, "the retry's pod", func() bool { pods = prepullPods(t, cs); return len(pods) == 1 })
	setPodStatus(t, cs, &pods[0], corev1.PodStatus{Phase: corev1.PodSucceeded})
	eventually(t, "PRESENT", func() bool { return b.PrepullReport().Images[0].State == runtime.PrepullPresent })
	if i := b.PrepullReport().Images[0]; i.NodesPresent != 2 || i.NodesTotal != 2 || i.LastError != "" || i.NextAttempt.IsZero() {
		t.Fatalf("present: %+v", i)
	}
}

// The report lists at most runtime.MaxPrepullReportImages images; the rest (and those
// beyond the pre-pull bound) are counted.
func TestPrepullReportBounded(t *testing.T) {
	b, _ := newFakeBackend(t, Config{MaxPrepull: 100})
	var ts []runtime.WarmTarget
	for n := range 110 {
		ts = append(ts, target(fmt.Sprintf("t%d", n), "org-a", nil, fmt.Sprintf("img/%d:1", n)))
	}
	if err := b.SetWarmPools(t.Context(), ts); err != nil {
		t.Fatal(err)
	}
	r := b.PrepullReport()
	if len(r.Images) != runtime.MaxPrepullReportImages || r.LeftOut != 110-runtime.MaxPrepullReportImages ||
		r.Images[0].Image != "img/0:1" || r.Images[0].State != runtime.PrepullPending || r.Images[0].NodesTotal != 0 {
		t.Fatalf("%d listed, %d left out, first %+v", len(r.Images), r.LeftOut, r.Images[0])
	}
}
