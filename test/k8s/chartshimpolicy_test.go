package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	osexec "os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// shimPolicy is the chart's ValidatingAdmissionPolicy and binding that keep the shim's Pod
// annotations to the runner (nodeAgent.admissionPolicy), decoded strictly.
type shimPolicy struct {
	policy  admissionv1.ValidatingAdmissionPolicy
	binding admissionv1.ValidatingAdmissionPolicyBinding
}

// shimPolicyOf returns the chart's shim annotation policy in r, or false if it renders
// none (and fails the test if it renders anything else of the kinds).
func shimPolicyOf(t *testing.T, r renderedChart) (shimPolicy, bool) {
	t.Helper()
	ps, bs := r.named("ValidatingAdmissionPolicy"), r.named("ValidatingAdmissionPolicyBinding")
	if len(ps) == 0 && len(bs) == 0 {
		return shimPolicy{}, false
	}
	var sp shimPolicy
	if len(ps) != 1 || len(bs) != 1 || !r.get(t, "ValidatingAdmissionPolicy/"+ps[0], &sp.policy) ||
		!r.get(t, "ValidatingAdmissionPolicyBinding/"+bs[0], &sp.binding) {
		t.Fatalf("want one ValidatingAdmissionPolicy and one binding, got %v %v", ps, bs)
	}
	return sp, true
}

// allowedUsers is the JSON list of users the policy's not-the-runner match condition exempts.
func (sp shimPolicy) allowedUsers(t *testing.T) []string {
	t.Helper()
	for _, mc := range sp.policy.Spec.MatchConditions {
		if mc.Name != "not-the-runner" {
			continue
		}
		_, list, ok := strings.Cut(mc.Expression, "request.userInfo.username in ")
		list = strings.TrimSuffix(strings.TrimSpace(list), ")")
		var users []string
		if !ok || !strings.HasPrefix(mc.Expression, "!(") || json.Unmarshal([]byte(list), &users) != nil {
			t.Fatalf("match condition not-the-runner: %q: want !(request.userInfo.username in [JSON list])", mc.Expression)
		}
		return users
	}
	t.Fatalf("no match condition not-the-runner in %+v", sp.policy.Spec.MatchConditions)
	return nil
}

// TestChartShimAdmissionPolicy (issue 21): with nodeAgent.enabled the chart renders a
// ValidatingAdmissionPolicy and its binding that keep the Pod annotations under
// runtime.ShimPodAnnotationPrefix to the runner's service account: cluster-scoped, named
// after the release and its namespace (two releases never share a name), failurePolicy
// Fail, matching Pod creates and updates, pods/status updates and pods/binding creates,
// bound to every namespace (the shim restores a Pod of any namespace) with Deny. The
// exempt user is the release's own ServiceAccount (the Deployment's; in the release
// namespace, not the sandbox namespace), then nodeAgent.admissionPolicy.allowedUsers. The
// expressions name the shim's prefix, the message the restore annotation. Off
// (nodeAgent.admissionPolicy.enabled=false, or no node agent): no policy, the rest of the
// render unchanged. Bad values fail the render naming them; so does a cluster that serves
// admissionregistration.k8s.io/v1 without ValidatingAdmissionPolicy (before 1.30). helm
// lint passes with it. What the policy admits and refuses on a real API server:
// TestSecurityRestoreAnnotation.
func TestChartShimAdmissionPolicy(t *testing.T) {
	helm := chartHelm(t)
	base := "nodeAgent.enabled=true,nodeAgent.runnerID=runner-1,nodeAgent.serverSecret=na-server,nodeAgent.clientSecret=na-client"
	if out, err := osexec.Command(helm, "lint", "--strict", chartDir, "--set", base).CombinedOutput(); err != nil {
		t.Errorf("helm lint %s: %v\n%s", base, err, out)
	}

	off, err := renderChart(t, helm, "sandboxd-runner")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := shimPolicyOf(t, off); ok {
		t.Error("no node agent: the chart renders the shim annotation policy")
	}
	// Off, the policy's values are not looked at.
	if _, err := renderChart(t, helm, "sandboxd-runner", "--set", "nodeAgent.admissionPolicy=1"); err != nil {
		t.Errorf("no node agent, nodeAgent.admissionPolicy=1: %v", err)
	}

	for _, tc := range []struct {
		name, release, ns string
		set               []string
		wantName          string
		wantUsers         []string
	}{
		{name: "defaults", release: "sandboxd-runner", ns: "sandboxd", set: []string{"--set", base},
			wantName:  "sandboxd-runner-sandboxd-shim-annotations",
			wantUsers: []string{"system:serviceaccount:sandboxd:sandboxd-runner"}},
		{name: "other release and namespace, sandboxes elsewhere, more users", release: "foo", ns: "runners",
			set: []string{"--set", base + ",sandboxNamespace=sbx",
				"--set", "nodeAgent.admissionPolicy.allowedUsers={system:serviceaccount:other:sandboxd-runner,system:serviceaccount:runners:foo-sandboxd-runner,ops@example.com}"},
			wantName: "foo-sandboxd-runner-runners-shim-annotations",
			// The runner's own account once, first.
			wantUsers: []string{"system:serviceaccount:runners:foo-sandboxd-runner", "system:serviceaccount:other:sandboxd-runner", "ops@example.com"}},
	} {
		r, err := renderChart(t, helm, tc.release, append(tc.set, "--namespace", tc.ns)...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		sp, ok := shimPolicyOf(t, r)
		if !ok {
			t.Errorf("%s: no shim annotation policy in %v", tc.name, r.keys())
			continue
		}
		p, b := sp.policy, sp.binding
		if p.Name != tc.wantName || b.Name != tc.wantName || p.Namespace != "" || b.Namespace != "" {
			t.Errorf("%s: policy %s/%s, binding %s/%s: want %s, cluster-scoped", tc.name, p.Namespace, p.Name, b.Namespace, b.Name, tc.wantName)
		}
		if p.Labels["app.kubernetes.io/instance"] != tc.release {
			t.Errorf("%s: policy labels %v", tc.name, p.Labels)
		}
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: failurePolicy %v, want Fail", tc.name, p.Spec.FailurePolicy)
		}
		mc := p.Spec.MatchConstraints
		if mc == nil || mc.NamespaceSelector != nil || mc.ObjectSelector != nil {
			t.Fatalf("%s: matchConstraints %+v: want resource rules only", tc.name, mc)
		}
		got := map[string][]admissionv1.OperationType{}
		for _, rule := range mc.ResourceRules {
			if !slices.Equal(rule.APIGroups, []string{""}) || !slices.Equal(rule.APIVersions, []string{"*"}) || rule.Scope != nil {
				t.Errorf("%s: rule %+v: want the core group, every version", tc.name, rule)
			}
			for _, res := range rule.Resources {
				got[res] = append(got[res], rule.Operations...)
			}
		}
		want := map[string][]admissionv1.OperationType{
			"pods":         {admissionv1.Create, admissionv1.Update},
			"pods/status":  {admissionv1.Create, admissionv1.Update},
			"pods/binding": {admissionv1.Create},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: matched %v, want %v", tc.name, got, want)
		}
		if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
			b.Spec.MatchResources != nil || b.Spec.ParamRef != nil {
			t.Errorf("%s: binding %+v: want policy %s, Deny, every namespace", tc.name, b.Spec, p.Name)
		}

		// The exempt users: the ServiceAccount the runner's Deployment runs as, in the
		// release namespace.
		var d appsv1.Deployment
		if names := r.named("Deployment"); len(names) != 1 || !r.get(t, "Deployment/"+names[0], &d) {
			t.Fatalf("%s: Deployments %v", tc.name, r.named("Deployment"))
		}
		var sa corev1.ServiceAccount
		if !r.get(t, "ServiceAccount/"+d.Spec.Template.Spec.ServiceAccountName, &sa) {
			t.Fatalf("%s: no ServiceAccount %q", tc.name, d.Spec.Template.Spec.ServiceAccountName)
		}
		if runnerUser := fmt.Sprintf("system:serviceaccount:%s:%s", sa.Namespace, sa.Name); tc.wantUsers[0] != runnerUser {
			t.Errorf("%s: the runner's user is %s, the test wants %s", tc.name, runnerUser, tc.wantUsers[0])
		}
		if users := sp.allowedUsers(t); !slices.Equal(users, tc.wantUsers) {
			t.Errorf("%s: exempt users %q, want %q", tc.name, users, tc.wantUsers)
		}

		// The shim's prefix in every expression that picks keys; the message names the
		// restore annotation and the runner.
		startsWith := "k.startsWith('" + runtime.ShimPodAnnotationPrefix + "')"
		exprs := map[string]string{}
		for _, c := range p.Spec.MatchConditions {
			exprs["matchCondition "+c.Name] = c.Expression
		}
		for _, v := range p.Spec.Variables {
			exprs["variable "+v.Name] = v.Expression
		}
		for _, k := range []string{"matchCondition touches-shim-annotations", "variable added", "variable had"} {
			if e, ok := exprs[k]; !ok || !strings.Contains(e, startsWith) || strings.Count(e, "startsWith(") != strings.Count(e, startsWith) {
				t.Errorf("%s: %s %q: want keys picked by %s", tc.name, k, e, startsWith)
			}
		}
		if len(p.Spec.MatchConditions) != 2 || len(p.Spec.Validations) != 1 {
			t.Fatalf("%s: matchConditions %+v validations %+v", tc.name, p.Spec.MatchConditions, p.Spec.Validations)
		}
		v := p.Spec.Validations[0]
		if v.Expression != "size(variables.changed) == 0" || v.Reason == nil || *v.Reason != "Forbidden" {
			t.Errorf("%s: validation %+v", tc.name, v)
		}
		for _, s := range []string{runtime.RestoreCheckpointAnnotation, tc.wantUsers[0], "request.userInfo.username", "variables.changed[0]"} {
			if !strings.Contains(v.MessageExpression, s) {
				t.Errorf("%s: messageExpression %q lacks %q", tc.name, v.MessageExpression, s)
			}
		}

		// nodeAgent.admissionPolicy.enabled=false: the same render without the two objects.
		without, err := renderChart(t, helm, tc.release, append(tc.set, "--namespace", tc.ns, "--set", "nodeAgent.admissionPolicy.enabled=false")...)
		if err != nil {
			t.Errorf("%s, policy off: %v", tc.name, err)
			continue
		}
		if _, ok := shimPolicyOf(t, without); ok {
			t.Errorf("%s: nodeAgent.admissionPolicy.enabled=false renders the policy", tc.name)
		}
		rest := maps.Clone(r)
		delete(rest, "ValidatingAdmissionPolicy/"+p.Name)
		delete(rest, "ValidatingAdmissionPolicyBinding/"+b.Name)
		if !reflect.DeepEqual(trimmed(without), trimmed(rest)) {
			t.Errorf("%s: policy off renders %v, want %v", tc.name, without.keys(), rest.keys())
		}
	}

	// A cluster whose admissionregistration.k8s.io/v1 has no ValidatingAdmissionPolicy
	// (Kubernetes before 1.30) fails the install rather than leaving the annotation open.
	old := []string{"--set", base, "--api-versions", "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration"}
	if _, err := renderChart(t, helm, "sandboxd-runner", old...); err == nil || !strings.Contains(err.Error(), "serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy") {
		t.Errorf("a cluster without ValidatingAdmissionPolicy: %v, want the render refused", err)
	}
	if _, err := renderChart(t, helm, "sandboxd-runner", append(old, "--set", "nodeAgent.admissionPolicy.enabled=false")...); err != nil {
		t.Errorf("a cluster without ValidatingAdmissionPolicy, policy off: %v", err)
	}
	if _, err := renderChart(t, helm, "sandboxd-runner", append(old, "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")...); err != nil {
		t.Errorf("a cluster with ValidatingAdmissionPolicy: %v", err)
	}

	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprintf("u%d", i)
	}
	for _, bad := range []struct{ set, err string }{
		{"nodeAgent.admissionPolicy=1", "nodeAgent.admissionPolicy: want a map with enabled true or false"},
		{"nodeAgent.admissionPolicy.enabled=yes", "nodeAgent.admissionPolicy: want a map with enabled true or false"},
		{"nodeAgent.admissionPolicy.allowedUsers=u1", "nodeAgent.admissionPolicy.allowedUsers: want a list of user names"},
		{"nodeAgent.admissionPolicy.allowedUsers={" + strings.Join(many, ",") + "}", "nodeAgent.admissionPolicy.allowedUsers: 17 users, want at most 16"},
		{"nodeAgent.admissionPolicy.allowedUsers={a b}", `nodeAgent.admissionPolicy.allowedUsers: "a b": want a Kubernetes user name`},
	} {
		_, err := renderChart(t, helm, "sandboxd-runner", "--set", base+","+bad.set)
		if bad.err == "" {
			if err != nil {
				t.Errorf("%s: %v", bad.set, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), bad.err) {
			t.Errorf("%s: %v, want the render refused with %q", bad.set, err, bad.err)
		}
	}
	// A user name that would break out of the CEL string (or the YAML) is refused.
	for _, bad := range []string{`x"]) || true || ([""`, `x'`, `x\`, "x\ny", ""} {
		if _, err := renderChart(t, helm, "sandboxd-runner", "--set", base, "--set-json", "nodeAgent.admissionPolicy.allowedUsers="+mustJSON(t, []string{bad})); err == nil ||
			!strings.Contains(err.Error(), "nodeAgent.admissionPolicy.allowedUsers:") {
			t.Errorf("allowedUsers %q: %v, want the render refused", bad, err)
		}
	}
}

// trimmed is r with each object's text trimmed (the last object of a render ends in a
// newline, the others do not).
func trimmed(r renderedChart) map[string]string {
	out := map[string]string{}
	for k, doc := range r {
		out[k] = strings.TrimSpace(string(doc))
	}
	return out
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSecurityRestoreAnnotation (issue 21): the attack the chart's shim annotation policy
// stops, on the real API server. The patched gVisor shim restores a Pod from the node's
// checkpoint its runtime.RestoreCheckpointAnnotation names, whoever made the Pod: anyone
// who may create Pods (or change their annotations) could resume another sandbox's memory
// in a Pod of their own. The chart is installed with nodeAgent.enabled (its runner and
// agents never start: an image that is not there, a node selector no node has; only the
// policy, the ServiceAccount and the Role count here), sandboxes in a namespace of their
// own. Each Pod is made with a scheduler that does not exist, so none is ever placed on
// the node. Refused, with the policy's message naming the annotation, the runner's account
// and the requester: an intruder service account (allowed by RBAC to create and patch
// Pods, their status and bindings in the sandbox namespace) creating a Pod with the
// restore annotation, or with another key under the prefix; the cluster admin
// (system:masters) doing the same in the sandbox namespace and in another one; the
// intruder adding the annotation to a Pod (update and pods/status), changing or removing
// the runner's; the admin binding a Pod with a Binding that carries it. Admitted: the same
// Pod without the annotation, the runner's service account creating it with the
// annotation, and updates that leave the annotations under the prefix as they are (another
// annotation, through pods and pods/status). After helm uninstall the policy and its
// binding are gone and the admin's Pod with the annotation is admitted again: the refusals
// were the policy's.
func TestSecurityRestoreAnnotation(t *testing.T) {
	c := needCluster(t)
	helm := needHelm(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const release = "sandboxd-runner"
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	node := nodes.Items[0].Name

	ns := randomID("sandboxd-vap-")
	sbxNS, otherNS := ns+"-sbx", ns+"-other"
	for name, level := range map[string]string{ns: "privileged", sbxNS: "baseline", otherNS: "baseline"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uninstall := func(ctx context.Context) ([]byte, error) {
		return osexec.CommandContext(ctx, helm, "uninstall", release, "--namespace", ns, "--kubeconfig", c.kubeconfig, "--wait", "--ignore-not-found").CombinedOutput()
	}
	t.Cleanup(func() {
		bg, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := uninstall(bg); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		for _, n := range []string{sbxNS, otherNS, ns} {
			_ = admin.CoreV1().Namespaces().Delete(bg, n, metav1.DeleteOptions{})
		}
	})
	install := osexec.CommandContext(ctx, helm, "install", release, chartDir, "--namespace", ns, "--kubeconfig", c.kubeconfig,
		// Nothing of the release runs: no runner image, no node with the agents' label.
		"--set", "image.repository=localhost/sandboxd/absent", "--set", "image.tag=none", "--set", "image.pullPolicy=Never",
		"--set", "controlPlane.address=127.0.0.1:1", "--set", "controlPlane.bootstrapToken=unused",
		"--set", "persistence.enabled=false", "--set", "sandboxNamespace="+sbxNS,
		"--set", "nodeAgent.enabled=true", "--set-string", "nodeAgent.runnerID=vap-test",
		"--set", "nodeAgent.serverSecret=absent-server", "--set", "nodeAgent.clientSecret=absent-client",
		"--set", `nodeAgent.nodeSelector.sandboxd\.dev/gvisor=null`, "--set-string", "nodeAgent.nodeSelector.sandboxd-test/no-such-node=true")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	policyName := release + "-" + ns + "-shim-annotations"
	runnerUser := "system:serviceaccount:" + ns + ":" + release
	vaps := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, policyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("the policy's binding: %v", err)
	}

	// The intruder: a service account of the sandbox namespace that RBAC lets create and
	// patch Pods there (their status and bindings too); the policy is all that stands in
	// its way.
	const intruderSA = "intruder"
	intruderUser := "system:serviceaccount:" + sbxNS + ":" + intruderSA
	if _, err := admin.CoreV1().ServiceAccounts(sbxNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: intruderSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(sbxNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: intruderSA},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "pods/status", "pods/binding"},
			Verbs: []string{"get", "create", "update", "patch", "delete"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(sbxNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: intruderSA},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: intruderSA},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: intruderSA, Namespace: sbxNS}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(user string) k8s.Interface {
		cfg := rest.CopyConfig(rc)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		return k8s.NewForConfigOrDie(cfg)
	}
	intruder, runnerSA := as(intruderUser), as(runnerUser)

	const ckpt = "cp-of-another-sandbox"
	restoreAnn := map[string]string{runtime.RestoreCheckpointAnnotation: ckpt}
	pod := func(ns, name string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann}, Spec: corev1.PodSpec{
			// No scheduler of this name: the Pod is never placed on the node.
			SchedulerName:                 "sandboxd-test-unscheduled",
			TerminationGracePeriodSeconds: ptrTo(int64(0)),
			Containers: []corev1.Container{{Name: "main", Image: "localhost/sandboxd/pause:k8s",
				ImagePullPolicy: corev1.PullNever}}}}
	}
	// refused: err is the policy's refusal of key, for user.
	refused := func(what string, err error, key, user string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: admitted, want the policy's refusal", what)
			return
		}
		msg := err.Error()
		for _, want := range []string{"ValidatingAdmissionPolicy '" + policyName + "'", "Pod annotation " + key + ":",
			"only the sandboxd runner " + runnerUser + " may set, change or remove them", "refused for " + user} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: %v, want the policy's refusal (%q)", what, err, want)
				return
			}
		}
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v: want 403 Forbidden", what, err)
		}
	}

	// The policy is in force once the API server has loaded it (its own informer): the
	// admin's dry-run create is refused.
	start := time.Now()
	for {
		_, err := admin.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "probe", restoreAnn), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), policyName) {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("30 s after helm install the admin's dry-run create of a Pod with %s: %v, want the policy's refusal", runtime.RestoreCheckpointAnnotation, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("policy in force %s after helm install", time.Since(start).Round(time.Millisecond))
	// Its expressions type-check against Pods and Bindings.
	for {
		p, err := vaps.Get(ctx, policyName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil {
			if w := p.Status.TypeChecking.ExpressionWarnings; len(w) != 0 {
				t.Errorf("the policy's type-checking warnings: %+v", w)
			}
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the policy's status: %+v", p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Creates.
	_, err = intruder.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "steal", restoreAnn), metav1.CreateOptions{})
	refused("the intruder's Pod with the restore annotation", err, runtime.RestoreCheckpointAnnotation, intruderUser)
	other := runtime.ShimPodAnnotationPrefix + "future-setting"
	_, err = intruder.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "steal-other", map[string]string{other: "x", "example.com/a": "b"}), metav1.CreateOptions{})
	refused("the intruder's Pod with another key under the shim's prefix", err, other, intruderUser)
	_, err = admin.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "steal-admin", restoreAnn), metav1.CreateOptions{})
	refused("the admin's Pod with the restore annotation", err, runtime.RestoreCheckpointAnnotation, "admin")
	_, err = admin.CoreV1().Pods(otherNS).Create(ctx, pod(otherNS, "steal-elsewhere", restoreAnn), metav1.CreateOptions{})
	refused("the admin's Pod with the restore annotation in another namespace", err, runtime.RestoreCheckpointAnnotation, "admin")

	plain, err := intruder.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "plain", map[string]string{"example.com/a": "b"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the intruder's Pod without the annotation: %v, want it admitted", err)
	}
	restored, err := runnerSA.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "restored", restoreAnn), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the runner's Pod with the restore annotation: %v, want it admitted", err)
	}
	if restored.Annotations[runtime.RestoreCheckpointAnnotation] != ckpt {
		t.Errorf("the runner's Pod: annotations %v", restored.Annotations)
	}

	// Updates, as merge patches of metadata.annotations (through pods and pods/status:
	// the status strategy keeps a patch's labels and annotations).
	annPatch := func(kv map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": kv}})
		return b
	}
	patch := func(k k8s.Interface, name string, kv map[string]any, sub ...string) error {
		_, err := k.CoreV1().Pods(sbxNS).Patch(ctx, name, types.MergePatchType, annPatch(kv), metav1.PatchOptions{}, sub...)
		return err
	}
	for _, sub := range [][]string{nil, {"status"}} {
		via := "pods"
		if sub != nil {
			via = "pods/status"
		}
		err := patch(intruder, plain.Name, map[string]any{runtime.RestoreCheckpointAnnotation: ckpt}, sub...)
		refused("the intruder adding the restore annotation to its Pod through "+via, err, runtime.RestoreCheckpointAnnotation, intruderUser)
		err = patch(intruder, restored.Name, map[string]any{runtime.RestoreCheckpointAnnotation: "cp-other"}, sub...)
		refused("the intruder changing the runner's restore annotation through "+via, err, runtime.RestoreCheckpointAnnotation, intruderUser)
		err = patch(intruder, restored.Name, map[string]any{runtime.RestoreCheckpointAnnotation: nil}, sub...)
		refused("the intruder removing the runner's restore annotation through "+via, err, runtime.RestoreCheckpointAnnotation, intruderUser)
		// Leaving them as they are is no change of theirs (the garbage collector, the
		// kubelet's status updates, an operator's annotation).
		if err := patch(intruder, restored.Name, map[string]any{"example.com/via": via}, sub...); err != nil {
			t.Errorf("another annotation on the runner's Pod through %s: %v, want it admitted", via, err)
		}
	}
	if p, err := admin.CoreV1().Pods(sbxNS).Get(ctx, plain.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if v, ok := p.Annotations[runtime.RestoreCheckpointAnnotation]; ok {
		t.Errorf("the intruder's Pod carries %s=%q", runtime.RestoreCheckpointAnnotation, v)
	}
	if p, err := admin.CoreV1().Pods(sbxNS).Get(ctx, restored.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Annotations[runtime.RestoreCheckpointAnnotation] != ckpt || p.Annotations["example.com/via"] != "pods/status" {
		t.Errorf("the runner's Pod's annotations after the patches: %v", p.Annotations)
	}

	// A Binding's annotations land on its Pod (as the scheduler binds).
	err = admin.CoreV1().Pods(sbxNS).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: plain.Name, Annotations: restoreAnn},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
	refused("the admin binding the intruder's Pod with the restore annotation", err, runtime.RestoreCheckpointAnnotation, "admin")
	if p, err := admin.CoreV1().Pods(sbxNS).Get(ctx, plain.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" || p.Annotations[runtime.RestoreCheckpointAnnotation] != "" {
		t.Errorf("the intruder's Pod after the refused binding: node %q, annotations %v", p.Spec.NodeName, p.Annotations)
	}
	for _, name := range []string{plain.Name, restored.Name} {
		_ = admin.CoreV1().Pods(sbxNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))})
	}

	// helm uninstall takes the policy and its binding away: the admin's Pod is admitted
	// again (the refusals above were this policy's).
	if out, err := uninstall(ctx); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if _, err := vaps.Get(ctx, policyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the policy after helm uninstall: %v, want NotFound", err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, policyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the policy's binding after helm uninstall: %v, want NotFound", err)
	}
	start = time.Now()
	for {
		_, err := admin.CoreV1().Pods(sbxNS).Create(ctx, pod(sbxNS, "probe", restoreAnn), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), policyName) || time.Since(start) > 30*time.Second {
			t.Fatalf("after helm uninstall the admin's dry-run create: %v, want it admitted", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
