package security

import (
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestK8sOrgPullSecretIsolation (issue 22 §4/§5: one image pull Secret per organization
// on Kubernetes runners, used by sandboxes and pre-pull Pods): an organization's Secret
// is never named by a Pod of another organization, and never holds another
// organization's token.
//   - A warm target of org-a carrying org-b's platform token (a spoofed or mixed-up
//     target) does not get it written into org-a's Secret, nor org-b's: the token's
//     claims must name the target's organization; it is used as the target's own
//     credentials only.
//   - A target of org-b naming org-a's image (with org-b's token) pulls with org-b's
//     Secret only: the registry refuses it, the node's copy is not reached through
//     org-a's Secret.
//   - A Secret at org-c's name that is not org-c's (annotation of another organization)
//     is refused, never overwritten, and no Pod names it.
func TestK8sOrgPullSecretIsolation(t *testing.T) {
	const host = "reg.example:5000"
	tok := func(org string) *runtime.Credentials {
		p := "v1|" + org + "|pull|" + strconv.FormatInt(time.Now().Add(15*time.Minute).Unix(), 10)
		return &runtime.Credentials{Username: "sandboxd", Password: "sbxreg." + base64.RawURLEncoding.EncodeToString([]byte(p)) + ".mac"}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	orgC := kubernetes.OrgPullSecretName("r1", "org-c")
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: orgC, Namespace: "sbx",
		Labels:      map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelRunner: "r1", kubernetes.LabelKind: kubernetes.KindOrgPull},
		Annotations: map[string]string{kubernetes.AnnotationOrg: "org-x"}}, Data: map[string][]byte{"k": []byte("v")}}
	cs := fake.NewSimpleClientset(node, foreign)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	b, err := kubernetes.New(ctx, kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		PlatformRegistry: host, PrepullInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	target := func(org, image string, creds *runtime.Credentials) runtime.WarmTarget {
		return runtime.WarmTarget{Key: org + "/t", Spec: runtime.Spec{Meta: map[string]string{runtime.MetaOrg: org},
			Container: runtime.Container{Image: image, PullCredentials: creds}}}
	}
	// One token per organization: a token made a second later differs (its expiry),
	// and the last check compares the Secret with org-b's.
	tokB := tok("org-b")
	spoofed := target("org-a", host+"/org-a/app:1", tokB)
	cross := target("org-b", host+"/org-a/app:2", tokB)
	blocked := target("org-c", host+"/org-c/app:1", tok("org-c"))
	if err := b.SetWarmPools(ctx, []runtime.WarmTarget{spoofed, cross, blocked}); err != nil {
		t.Fatal(err)
	}
	secretsOf := map[string][]string{}
	for len(secretsOf) < 2 {
		if ctx.Err() != nil {
			t.Fatalf("pre-pull pods: %v", secretsOf)
		}
		l, err := cs.CoreV1().Pods("sbx").List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelKind + "=" + kubernetes.KindPrepull})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range l.Items {
			var names []string
			for _, r := range p.Spec.ImagePullSecrets {
				names = append(names, r.Name)
			}
			secretsOf[p.Spec.Containers[0].Image] = names
		}
		time.Sleep(20 * time.Millisecond)
	}
	orgA, orgB := kubernetes.OrgPullSecretName("r1", "org-a"), kubernetes.OrgPullSecretName("r1", "org-b")
	if s := secretsOf[host+"/org-a/app:1"]; slices.Contains(s, orgA) || slices.Contains(s, orgB) || len(s) != 1 {
		t.Errorf("org-a's target with org-b's token pulls with %v: want its own pre-pull secret only", s)
	}
	if s := secretsOf[host+"/org-a/app:2"]; !slices.Equal(s, []string{orgB}) {
		t.Errorf("org-b's target naming org-a's image pulls with %v, want [%s] only", s, orgB)
	}
	if _, ok := secretsOf[host+"/org-c/app:1"]; ok {
		t.Error("a Pod names the Secret at org-c's name that is another organization's")
	}
	if _, err := cs.CoreV1().Secrets("sbx").Get(ctx, orgA, metav1.GetOptions{}); err == nil {
		t.Error("org-a's Secret was written from org-b's token")
	}
	sec, err := cs.CoreV1().Secrets("sbx").Get(ctx, orgC, metav1.GetOptions{})
	if err != nil || string(sec.Data["k"]) != "v" || sec.Annotations[kubernetes.AnnotationOrg] != "org-x" {
		t.Errorf("the foreign Secret at org-c's name was changed: %v %v", sec, err)
	}
	if sec, err := cs.CoreV1().Secrets("sbx").Get(ctx, orgB, metav1.GetOptions{}); err != nil ||
		!strings.Contains(string(sec.Data[corev1.DockerConfigJsonKey]), tokB.Password) {
		t.Errorf("org-b's Secret: %v (err %v), want org-b's token", sec, err)
	}
}
