package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/install"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// The runner's Roles are written three times: the Helm chart (templates/rbac.yaml),
// the plain manifest rendered from it (deploy/kubernetes/runner.yaml; test/k8s checks it
// is the chart's rendering) and the installer the control plane runs (internal/install).
// roleCopies reads the Role named name from each, by copy.
func roleCopies(t *testing.T, name string) map[string]*rbacv1.Role {
	t.Helper()
	return map[string]*rbacv1.Role{
		"chart":     findRole(t, "deploy/helm/sandboxd-runner/templates/rbac.yaml", chartYAML(t), name),
		"manifest":  findRole(t, "deploy/kubernetes/runner.yaml", readRepo(t, "deploy/kubernetes/runner.yaml"), name),
		"installer": installerRole(t, name),
	}
}

func readRepo(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../../" + path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// chartYAML is the chart's rbac.yaml as plain YAML without helm: whole-line actions
// ({{- if }}, {{- include "labels" }}) dropped, the names the Roles use put in. Any other
// action left fails the test (the template grew logic this reading would get wrong). The
// node agent's certificate rules (the block under nodeAgentIssue) are the chart's alone:
// the manifest and the installer deploy no node agent, so they are left out here
// (test/k8s TestChartNodeAgent checks them in helm's render).
func chartYAML(t *testing.T) []byte {
	t.Helper()
	raw := string(readRepo(t, "deploy/helm/sandboxd-runner/templates/rbac.yaml"))
	names := strings.NewReplacer(
		`{{ include "sandboxd-runner.fullname" . }}`, install.ReleaseName,
		`{{ include "sandboxd-runner.sandboxNamespace" . }}`, "sandboxd",
		`{{ .Release.Namespace }}`, "sandboxd",
	)
	var out []string
	skipping := false
	for _, line := range strings.Split(raw, "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, `{{- if include "sandboxd-runner.nodeAgentIssue"`) {
			skipping = true
			continue
		}
		if skipping {
			skipping = trim != "{{- end }}"
			continue
		}
		if strings.HasPrefix(trim, "{{") && strings.HasSuffix(trim, "}}") {
			continue
		}
		line = names.Replace(line)
		if strings.Contains(line, "{{") {
			t.Fatalf("chart rbac.yaml: a template action this test does not read: %q", line)
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "\n"))
}

func findRole(t *testing.T, file string, raw []byte, name string) *rbacv1.Role {
	t.Helper()
	for doc := range bytes.SplitSeq(raw, []byte("\n---")) {
		var r rbacv1.Role
		if err := yaml.Unmarshal(doc, &r); err != nil || r.Kind != "Role" || r.Name != name {
			continue
		}
		return &r
	}
	t.Fatalf("no Role %s in %s", name, file)
	return nil
}

func installerRole(t *testing.T, name string) *rbacv1.Role {
	t.Helper()
	for _, o := range install.Objects(install.Values{Namespace: "sandboxd"}) {
		if r, ok := o.(*rbacv1.Role); ok && r.Name == name {
			return r
		}
	}
	t.Fatalf("no Role %s in install.Objects", name)
	return nil
}

// grants is what a Role allows, one "group resource[/name] verb" a grant.
func grants(r *rbacv1.Role) map[string]bool {
	g := map[string]bool{}
	for _, rule := range r.Rules {
		names := rule.ResourceNames
		if len(names) == 0 || slices.Equal(rule.Resources, []string{"configmaps"}) && len(names) == 1 && strings.HasPrefix(names[0], gate.EgressRootsConfigMapPrefix) {
			// The installer names the runner's egress roots ConfigMap (it knows the
			// runner's ID); the chart and the manifest cannot (the ID is issued at
			// registration) and grant the verbs namespace-wide: the same verbs.
			names = []string{""}
		}
		for _, grp := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, n := range names {
					for _, v := range rule.Verbs {
						g[fmt.Sprintf("%q %s/%s %s", grp, res, n, v)] = true
					}
				}
			}
		}
	}
	return g
}

// TestRunnerRoleCopiesAgree: the chart, the manifest and the installer grant the runner
// the same, in the sandbox namespace and in its own: a grant one copy lacks (the Pod
// patch the installer lacked) fails here, without a cluster.
func TestRunnerRoleCopiesAgree(t *testing.T) {
	for _, name := range []string{install.ReleaseName + "-sandboxes", install.ReleaseName + "-self"} {
		copies := roleCopies(t, name)
		all := map[string]bool{}
		for _, r := range copies {
			maps.Copy(all, grants(r))
		}
		for copyName, r := range copies {
			g := grants(r)
			for _, k := range slices.Sorted(maps.Keys(all)) {
				if !g[k] {
					t.Errorf("Role %s: the %s lacks %s, which another copy grants", name, copyName, k)
				}
			}
		}
	}
}

// enforceRole makes cs refuse (403) every call role does not grant, as the API server would.
func enforceRole(cs *k8stesting.Fake, role *rbacv1.Role) {
	cs.PrependReactor("*", "*", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, a.GetResource().Group) && slices.Contains(r.Resources, a.GetResource().Resource) && slices.Contains(r.Verbs, a.GetVerb()) {
				return false, nil, nil
			}
		}
		gr := schema.GroupResource{Group: a.GetResource().Group, Resource: a.GetResource().Resource}
		return true, nil, apierrors.NewForbidden(gr, "", errors.New(a.GetVerb()+" not granted by the runner's Role"))
	})
}

// TestRunnerRoleGrantsWriterMark: each copy of the runner's Role (roleCopies) lets the
// runner mark a GLOBAL writer's Pod started (a Pod patch): without it every writer's
// create failed with 403 in a real deployment, while the test cluster's admin kubeconfig
// hid it.
func TestRunnerRoleGrantsWriterMark(t *testing.T) {
	for copyName, role := range roleCopies(t, install.ReleaseName+"-sandboxes") {
		t.Run(copyName, func(t *testing.T) {
			spec := writerSpec("")
			b, cs := newFakeBackend(t, Config{}, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID), Namespace: "sbx"}})
			enforceRole(&cs.Fake, role)
			s := &sandbox{id: spec.ID, spec: *spec, changed: make(chan struct{}), done: make(chan struct{})}
			if err := b.markStarted(t.Context(), s); err != nil {
				t.Fatalf("markStarted under the %s's Role: %v", copyName, err)
			}
			// The reactor does refuse what the Role lacks.
			if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID)}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("a Pod status update, which the Role does not grant: %v, want Forbidden", err)
			}
		})
	}
}

// TestRunnerRoleGrantsBackendCalls: every call the backend makes in the sandbox
// namespace while it starts, creates a sandbox (a GLOBAL writer; the create times out
// against the fake cluster and is rolled back), marks a writer started, makes and
// removes a registered volume's claim, recovers and destroys, claims a warm Pod, is granted by each copy
// of the runner's Role: a verb the runner calls that every copy lacks fails here too
// (TestRunnerRoleCopiesAgree catches one copy lacking it). Cluster-scoped calls
// (StorageClasses, nodes) are the ClusterRole's, optional, and not checked here.
func TestRunnerRoleGrantsBackendCalls(t *testing.T) {
	claimBindWait = 100 * time.Millisecond
	marked := writerSpec("")
	marked.ID = "marked"
	b, cs := newFakeBackend(t, Config{}, storageClass("std", true, true, ""),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(marked.ID), Namespace: "sbx"}})
	ctx := t.Context()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := b.Create(cctx, writerSpec("")); err == nil {
		t.Fatal("Create against a fake cluster whose Pods never run succeeded")
	}
	if err := b.markStarted(ctx, &sandbox{id: marked.ID, spec: *marked, changed: make(chan struct{}), done: make(chan struct{})}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsureClaim(ctx, testClaim("org-a", "data")); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveClaim(ctx, testClaim("org-a", "data")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(ctx, marked.ID); err != nil {
		t.Fatal(err)
	}
	// A claim of a warm Pod (its own backend: a warm pool): the spec into its Secret,
	// the caller onto its Pod (UID-checked), NetworkPolicy and pull Secret.
	wb, wcs := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
	if r := claimOn(t, wb, wcs, &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startOK: true}, false); !r.claimed || r.err != nil {
		t.Fatalf("warm claim: claimed %v err %v", r.claimed, r.err)
	}
	uidChecked := false
	for _, a := range wcs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "pods" && bytes.Contains(p.GetPatch(), []byte(`"uid":"u-warm"`)) {
			uidChecked = true
		}
	}
	if !uidChecked {
		t.Error("the warm claim made no UID-checked Pod patch")
	}
	calls := map[string]k8stesting.Action{}
	for _, a := range append(cs.Actions(), wcs.Actions()...) {
		if a.GetNamespace() == "" {
			continue
		}
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		calls[fmt.Sprintf("%q %s/ %s", a.GetResource().Group, res, a.GetVerb())] = a
	}
	for _, want := range []string{`"" pods/ create`, `"" pods/ patch`, `"" pods/ delete`, `"" pods/ list`, `"" pods/ watch`,
		`"" secrets/ create`, `"" secrets/ patch`,
		`"networking.k8s.io" networkpolicies/ patch`, `"" persistentvolumeclaims/ create`, `"" persistentvolumeclaims/ delete`} {
		if calls[want] == nil {
			t.Errorf("the scenario made no call %s (it no longer covers what it says)", want)
		}
	}
	for copyName, role := range roleCopies(t, install.ReleaseName+"-sandboxes") {
		g := grants(role)
		for _, k := range slices.Sorted(maps.Keys(calls)) {
			if !g[k] {
				t.Errorf("the %s's Role does not grant %s, which the backend calls", copyName, k)
			}
		}
	}
}
