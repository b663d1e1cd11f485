package kubernetes

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestCreateDuplicateID: a Create whose ID is taken by a sandbox the runner does not
// track (another runner's, or one not recovered yet) fails as a duplicate and leaves that
// sandbox's Secret, pull Secret, NetworkPolicy and Pod as they were: nothing is
// overwritten by the parallel writes, nothing deleted by the failed Create's undo.
func TestCreateDuplicateID(t *testing.T) {
	const id = "dup1"
	lbl := map[string]string{LabelSandbox: id}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx", Labels: lbl},
		Data: map[string][]byte{secretSpec: []byte(`{"id":"dup1"}`)}}
	pull := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pullSecretName(id), Namespace: "sbx", Labels: lbl},
		Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: networkPolicyName(id), Namespace: "sbx", Labels: lbl},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: lbl},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", Labels: lbl, UID: "existing"}}
	b, cs := newFakeBackend(t, Config{}, sec, pull, np, pod)

	spec := &runtime.Spec{ID: id, Container: runtime.Container{Image: "ghcr.io/x/y:1", Command: "sleep",
		PullCredentials: &runtime.Credentials{Username: "u", Password: "p"}},
		Network: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}}}
	_, err := b.Create(t.Context(), spec)
	if !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("Create = %v, want a duplicate's ErrInvalidSpec", err)
	}
	for _, a := range cs.Actions() {
		switch a.GetVerb() {
		case "delete", "update", "patch":
			t.Errorf("the failed Create wrote %s %s %s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}
	for _, o := range []struct {
		res  string
		name string
		want k8sruntime.Object
	}{
		{"secrets", sec.Name, sec}, {"secrets", pull.Name, pull},
		{"networkpolicies", np.Name, np}, {"pods", pod.Name, pod},
	} {
		var got k8sruntime.Object
		var gerr error
		switch o.res {
		case "secrets":
			got, gerr = cs.CoreV1().Secrets("sbx").Get(t.Context(), o.name, metav1.GetOptions{})
		case "networkpolicies":
			got, gerr = cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), o.name, metav1.GetOptions{})
		case "pods":
			got, gerr = cs.CoreV1().Pods("sbx").Get(t.Context(), o.name, metav1.GetOptions{})
		}
		if gerr != nil {
			t.Errorf("%s %s: %v", o.res, o.name, gerr)
			continue
		}
		if !equalObj(got, o.want) {
			t.Errorf("%s %s changed:\n got %+v\nwant %+v", o.res, o.name, got, o.want)
		}
	}
	b.mu.Lock()
	left := b.sandboxes[id]
	b.mu.Unlock()
	if left != nil {
		t.Error("the failed Create stayed tracked")
	}
}

func equalObj(a, b k8sruntime.Object) bool {
	switch x := a.(type) {
	case *corev1.Secret:
		y := b.(*corev1.Secret)
		return string(x.Data[secretSpec]) == string(y.Data[secretSpec]) && len(x.Data) == len(y.Data)
	case *networkingv1.NetworkPolicy:
		y := b.(*networkingv1.NetworkPolicy)
		return len(x.Spec.Egress) == len(y.Spec.Egress) && len(x.Spec.Ingress) == len(y.Spec.Ingress) && len(x.Spec.PolicyTypes) == len(y.Spec.PolicyTypes)
	case *corev1.Pod:
		return x.UID == b.(*corev1.Pod).UID
	}
	return false
}

// TestCreateDuplicateIDNoPolicy: when the existing sandbox has no NetworkPolicy, the one
// the failed duplicate Create wrote (in parallel with its Secret) is removed again: it
// would select the existing sandbox's Pod.
func TestCreateDuplicateIDNoPolicy(t *testing.T) {
	const id = "dup2"
	lbl := map[string]string{LabelSandbox: id}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx", Labels: lbl}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", Labels: lbl, UID: "existing"}}
	b, cs := newFakeBackend(t, Config{}, sec, pod)
	spec := &runtime.Spec{ID: id, Container: runtime.Container{Image: "ghcr.io/x/y:1", Command: "sleep"},
		Network: &runtime.Network{DenyEgress: true}}
	if _, err := b.Create(t.Context(), spec); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("Create = %v, want a duplicate's ErrInvalidSpec", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies("sbx").Get(t.Context(), networkPolicyName(id), metav1.GetOptions{}); err == nil {
		t.Error("the failed Create's policy stayed")
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(id), metav1.GetOptions{}); err != nil {
		t.Errorf("existing Secret: %v", err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName(id), metav1.GetOptions{}); err != nil {
		t.Errorf("existing Pod: %v", err)
	}
}
