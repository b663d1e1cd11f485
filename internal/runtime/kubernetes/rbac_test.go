package kubernetes

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"
)

// sandboxRole is the Role the shipped manifest (deploy/kubernetes/runner.yaml, rendered
// from the Helm chart) grants the runner in its sandbox namespace.
func sandboxRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	raw, err := os.ReadFile("../../../deploy/kubernetes/runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for doc := range bytes.SplitSeq(raw, []byte("\n---")) {
		var r rbacv1.Role
		if err := yaml.Unmarshal(doc, &r); err != nil || r.Kind != "Role" || r.Name != "sandboxd-runner-sandboxes" {
			continue
		}
		return &r
	}
	t.Fatal("no Role sandboxd-runner-sandboxes in deploy/kubernetes/runner.yaml")
	return nil
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

// TestRunnerRoleGrantsWriterMark: the shipped Role lets the runner mark a GLOBAL
// writer's Pod started (a Pod patch): without it every writer's create failed with 403
// in a real deployment, while the test cluster's admin kubeconfig hid it.
func TestRunnerRoleGrantsWriterMark(t *testing.T) {
	spec := writerSpec("")
	b, cs := newFakeBackend(t, Config{}, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID), Namespace: "sbx"}})
	enforceRole(&cs.Fake, sandboxRole(t))
	s := &sandbox{id: spec.ID, spec: *spec, changed: make(chan struct{}), done: make(chan struct{})}
	if err := b.markStarted(t.Context(), s); err != nil {
		t.Fatalf("markStarted under the shipped Role: %v", err)
	}
	// The reactor does refuse what the Role lacks.
	if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID)}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a Pod status update, which the Role does not grant: %v, want Forbidden", err)
	}
}
