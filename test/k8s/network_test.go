package k8s

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestNetworkPolicy: a sandbox with network rules gets its NetworkPolicy before its Pod
// runs (selecting its Pod, the runner allowed in, DNS and the rules out), owned by the
// Pod; a runner that re-adopts the sandbox re-creates a policy deleted behind its back
// and restores one changed behind its back; delete removes it. A host-name rule is refused before anything is made. (The test
// cluster's bridge CNI does not enforce NetworkPolicy: the objects are checked, not the
// traffic.)
func TestNetworkPolicy(t *testing.T) {
	c, s, runnerID := setup(t)
	ctx := context.Background()
	nps := s.Client.NetworkingV1().NetworkPolicies(c.namespace)

	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		Services:  []runtime.Service{{Port: 8080, Visibility: "private"}},
		Network: &runtime.Network{Egress: append(runtime.DefaultEgress(),
			runtime.EgressRule{CIDR: "203.0.113.0/24", Except: []string{"203.0.113.0/28"}, Ports: []runtime.PortRange{{Port: 443}}})},
		Meta: map[string]string{runtime.MetaOrg: "org-n"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if sb := waitState(t, s.Runner, id, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	check := func(np *networkingv1.NetworkPolicy) {
		t.Helper()
		if got := np.Spec.PodSelector.MatchLabels[kubernetes.LabelSandbox]; got != id {
			t.Errorf("selects sandbox %q, want %s", got, id)
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
			t.Errorf("policy types %v", np.Spec.PolicyTypes)
		}
		// Ingress: the gate's port (no runner peers configured) and the private service
		// from the organization.
		if len(np.Spec.Ingress) != 2 || np.Spec.Ingress[1].From[0].PodSelector.MatchLabels[kubernetes.LabelOrg] != "org-n" ||
			np.Spec.Ingress[1].Ports[0].Port.IntValue() != 8080 {
			t.Errorf("ingress %+v", np.Spec.Ingress)
		}
		// Egress: DNS, the internet without the private ranges, the organization, the CIDR,
		// and the gate's hello to the runner (UDP to its hello port only).
		if len(np.Spec.Egress) != 5 {
			t.Fatalf("egress %+v", np.Spec.Egress)
		}
		if h := np.Spec.Egress[4]; len(h.Ports) != 1 || h.Ports[0].Protocol == nil || *h.Ports[0].Protocol != corev1.ProtocolUDP ||
			h.Ports[0].Port.IntValue() <= 0 || len(h.To) != 1 || h.To[0].IPBlock == nil || !strings.HasSuffix(h.To[0].IPBlock.CIDR, "/32") {
			t.Errorf("hello rule %+v, want UDP to one port of one address", h)
		}
		if p := np.Spec.Egress[0].Ports; len(p) != 2 || p[0].Port.IntValue() != 53 {
			t.Errorf("DNS rule %+v", np.Spec.Egress[0])
		}
		if blk := np.Spec.Egress[1].To[0].IPBlock; blk == nil || blk.CIDR != "0.0.0.0/0" || !slices.Contains(blk.Except, "169.254.0.0/16") || !slices.Contains(blk.Except, "10.0.0.0/8") {
			t.Errorf("internet rule %+v", np.Spec.Egress[1])
		}
		if blk := np.Spec.Egress[3].To[0].IPBlock; blk == nil || blk.CIDR != "203.0.113.0/24" || !slices.Equal(blk.Except, []string{"203.0.113.0/28"}) || np.Spec.Egress[3].Ports[0].Port.IntValue() != 443 {
			t.Errorf("CIDR rule %+v", np.Spec.Egress[3])
		}
	}
	var np *networkingv1.NetworkPolicy
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// The owner reference is set right after the Pod is created.
		if np, err = nps.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		if len(np.OwnerReferences) == 1 || time.Now().After(deadline) {
			break
		}
	}
	check(np)
	if o := np.OwnerReferences; len(o) != 1 || o[0].UID != pod.UID {
		t.Errorf("owner %+v, want the Pod %s", o, pod.UID)
	}

	// Deleted behind the runner's back; a runner re-adopting the sandbox re-creates it.
	if err := nps.Delete(ctx, "sbx-"+id, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := newStack(t, c, runnerID, t.TempDir())
	defer s2.Close()
	if np, err = nps.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil {
		t.Fatalf("after re-adoption: %v", err)
	}
	check(np)
	if o := np.OwnerReferences; len(o) != 1 || o[0].UID != pod.UID {
		t.Errorf("re-created policy's owner %+v, want the Pod %s", o, pod.UID)
	}

	// Changed behind the runner's back (opened to everything); re-adoption restores the
	// rules the sandbox was given.
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	if _, err := nps.Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	s3 := newStack(t, c, runnerID, t.TempDir())
	defer s3.Close()
	if np, err = nps.Get(ctx, "sbx-"+id, metav1.GetOptions{}); err != nil {
		t.Fatalf("after the second re-adoption: %v", err)
	}
	check(np)

	if _, err := s3.Runner.Delete(id, time.Second); err != nil {
		t.Fatal(err)
	}
	terminal(t, s3.Runner, id)
	podGone(t, s3, c, id)
	if _, err := nps.Get(ctx, "sbx-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the network policy outlived its sandbox: %v", err)
	}

	// A rule NetworkPolicy cannot express: refused, nothing made.
	sb, err = s3.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}},
		Network:   &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com"}}},
	}})
	switch {
	case err == nil: // the runner reports start errors as the sandbox's end
		sb = terminal(t, s3.Runner, sb.ID)
		if sb.State != runner.StateFailed || !strings.Contains(sb.Message, `host-name rule "api.example.com"`) {
			t.Errorf("host-name rule: %s %s: %s", sb.State, sb.Reason, sb.Message)
		}
		podGone(t, s3, c, sb.ID)
	default:
		// The runner refuses it itself (runtime.Support) before the backend sees it.
		var verr *runner.ValidationError
		if !errors.As(err, &verr) || !strings.Contains(err.Error(), "egress[0].https_hostname") {
			t.Errorf("host-name rule: %v, want a validation error naming the rule", err)
		}
	}
}

// TestPodSettings: the policy's base pod fragment (node selector, toleration, priority
// class, service account, image pull secret, annotations) reaches the Pod of a sandbox
// created through the gateway, and the Pod schedules and runs.
func TestPodSettings(t *testing.T) {
	c, s, runnerID := setup(t)
	ctx := context.Background()
	pc := randomID("sandboxd-test-")
	if _, err := s.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: pc}, Value: 10}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), pc, metav1.DeleteOptions{})
	})
	sa := randomID("sandbox-")
	if _, err := s.Client.CoreV1().ServiceAccounts(c.namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Client.CoreV1().ServiceAccounts(c.namespace).Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	doc := `{"base": {"pod": {
		"node_selector": {"kubernetes.io/os": "linux"},
		"tolerations": [{"key": "sandboxd.io/dedicated", "operator": "Equal", "value": "sandboxes", "effect": "NoSchedule"}],
		"priority_class_name": "` + pc + `", "service_account_name": "` + sa + `",
		"image_pull_secrets": ["regcred"], "annotations": {"example.com/team": "ml"}}}}`
	_, api, _ := serveGateway(t, gateway.Config{
		Runners:  []runner.Handle{runner.NewLocal(runnerID, s.Runner)},
		Policies: policyMap{runnerID: doc}})
	res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "sleep", Args: []string{"3600"},
			Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "32Mi"}}},
	}}}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	if sb := waitState(t, s.Runner, id, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps := pod.Spec
	if ps.NodeSelector["kubernetes.io/os"] != "linux" || pod.Spec.NodeName == "" {
		t.Errorf("node selector %v, scheduled on %q", ps.NodeSelector, ps.NodeName)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "sandboxd.io/dedicated" && tl.Value == "sandboxes" && tl.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("tolerations %+v", ps.Tolerations)
	}
	if ps.PriorityClassName != pc || ps.Priority == nil || *ps.Priority != 10 {
		t.Errorf("priority class %q (%v), want %s", ps.PriorityClassName, ps.Priority, pc)
	}
	if ps.ServiceAccountName != sa || ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("service account %q (automount %v), want %s without its token", ps.ServiceAccountName, ps.AutomountServiceAccountToken, sa)
	}
	if len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("image pull secrets %v", ps.ImagePullSecrets)
	}
	if pod.Annotations["example.com/team"] != "ml" {
		t.Errorf("annotations %v", pod.Annotations)
	}
}
