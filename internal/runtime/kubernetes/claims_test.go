package kubernetes

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func storageClass(name string, def, late bool, mode string) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}, Provisioner: "example.com/p"}
	if def {
		sc.Annotations[annotationDefaultClass] = "true"
	}
	if mode != "" {
		sc.Annotations[AnnotationAccessMode] = mode
	}
	if late {
		m := storagev1.VolumeBindingWaitForFirstConsumer
		sc.VolumeBindingMode = &m
	}
	return sc
}

func existingClaim(name, class string, lbls map[string]string, phase corev1.PersistentVolumeClaimPhase, capacity string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", Labels: lbls},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, Resources: corev1.VolumeResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: phase},
	}
	if capacity != "" {
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
	}
	return pvc
}

func testClaim(org, name string) runtime.Claim {
	return runtime.Claim{Org: org, Name: name, Managed: runtime.ManagedVolumeName(org, name)}
}

func TestEnsureClaimMakes(t *testing.T) {
	claimBindWait = 100 * time.Millisecond
	ctx := context.Background()
	b, cs := newFakeBackend(t, Config{}, storageClass("std", true, true, ""), storageClass("rwo", false, true, "ReadWriteOnce"), storageClass("other", false, true, ""))
	n, err := b.EnsureClaim(ctx, testClaim("org-a", "data"))
	if err != nil {
		t.Fatal(err)
	}
	if n.CapacityBytes != runtime.DefaultClaimBytes {
		t.Errorf("capacity %d, want the requested %d (Pending, WaitForFirstConsumer)", n.CapacityBytes, runtime.DefaultClaimBytes)
	}
	if !slices.Equal(n.AccessModes, []string{"ReadWriteMany"}) {
		t.Errorf("access modes %q, want the made claim's ReadWriteMany", n.AccessModes)
	}
	pvc, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *pvc.Spec.StorageClassName != "std" || pvc.Spec.AccessModes[0] != corev1.ReadWriteMany ||
		pvc.Labels[LabelManagedBy] != ManagedBy || pvc.Labels[LabelVolumeOrg] != runtime.OrgHash("org-a") ||
		pvc.Labels[LabelRegisteredVolume] != runtime.ManagedVolumeName("org-a", "data") {
		t.Errorf("made claim: %+v %+v", pvc.Labels, pvc.Spec)
	}
	// Idempotent.
	if _, err := b.EnsureClaim(ctx, testClaim("org-a", "data")); err != nil {
		t.Fatal(err)
	}
	// The policy's class, a class that offers only ReadWriteOnce, a size.
	c := testClaim("org-a", "small")
	c.StorageClass, c.SizeBytes, c.AllowedStorageClasses = "rwo", 1<<30, []string{"rwo"}
	if st, err := b.EnsureClaim(ctx, c); err != nil || !slices.Equal(st.AccessModes, []string{"ReadWriteOnce"}) {
		t.Fatalf("rwo class: %+v %v, want access modes [ReadWriteOnce]", st, err)
	}
	pvc, _ = cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "small", metav1.GetOptions{})
	if *pvc.Spec.StorageClassName != "rwo" || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce || pvc.Spec.Resources.Requests.Storage().Value() != 1<<30 {
		t.Errorf("small: %+v", pvc.Spec)
	}
	// The cluster default outside the allowed list: refused, nothing made.
	c = testClaim("org-a", "refused")
	c.AllowedStorageClasses = []string{"other"}
	if _, err := b.EnsureClaim(ctx, c); !errors.Is(err, runtime.ErrClaimIneligible) || !strings.Contains(err.Error(), "std") {
		t.Errorf("default class not allowed: %v", err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "refused", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("refused claim made: %v", err)
	}
	// Another organization may not take the claim org-a's volume made.
	if _, err := b.EnsureClaim(ctx, testClaim("org-b", "data")); !errors.Is(err, runtime.ErrClaimIneligible) {
		t.Errorf("org-b adopting org-a's claim: %v", err)
	}
	// Delete: gone.
	if err := b.RemoveClaim(ctx, testClaim("org-b", "data")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "data", metav1.GetOptions{}); err != nil {
		t.Errorf("org-b's RemoveClaim touched org-a's claim: %v", err)
	}
	if err := b.RemoveClaim(ctx, testClaim("org-a", "data")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "data", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("made claim not deleted: %v", err)
	}
}

func TestEnsureClaimAdopts(t *testing.T) {
	ctx := context.Background()
	grant := map[string]string{LabelVolumeOrg: runtime.OrgHash("org-a")}
	rwop := existingClaim("bound-rwop", "std", grant, corev1.ClaimBound, "2Gi")
	rwop.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteOncePod}
	rwop.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	objs := []k8sruntime.Object{
		storageClass("std", true, false, ""), storageClass("late", false, true, ""),
		existingClaim("runner-data", "std", nil, corev1.ClaimBound, "5Gi"),
		existingClaim("granted", "std", grant, corev1.ClaimBound, "5Gi"),
		existingClaim("pending-late", "late", grant, corev1.ClaimPending, ""),
		existingClaim("pending-now", "std", grant, corev1.ClaimPending, ""),
		existingClaim("lost", "std", grant, corev1.ClaimLost, ""),
		rwop,
	}
	b, cs := newFakeBackend(t, Config{}, objs...)
	for name, want := range map[string]string{
		"runner-data":   "not granted",
		"pending-now":   "Pending",
		"lost":          "Lost",
		"granted/org-b": "not granted",
	} {
		c := testClaim("org-a", name)
		if n, o, ok := strings.Cut(name, "/"); ok {
			c = testClaim(o, n)
		}
		if _, err := b.EnsureClaim(ctx, c); !errors.Is(err, runtime.ErrClaimIneligible) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ineligible %q", name, err, want)
		}
	}
	c := testClaim("org-a", "granted")
	c.AllowedStorageClasses = []string{"late"}
	if _, err := b.EnsureClaim(ctx, c); !errors.Is(err, runtime.ErrClaimIneligible) || !strings.Contains(err.Error(), "storage class") {
		t.Errorf("class not allowed: %v", err)
	}
	n, err := b.EnsureClaim(ctx, testClaim("org-a", "granted"))
	if err != nil || n.CapacityBytes != 5<<30 {
		t.Fatalf("granted: %+v %v", n, err)
	}
	// An adopted claim naming no access mode: Kubernetes' default, ReadWriteOnce.
	if !slices.Equal(n.AccessModes, []string{"ReadWriteOnce"}) {
		t.Errorf("granted: access modes %q, want [ReadWriteOnce]", n.AccessModes)
	}
	if n, err := b.EnsureClaim(ctx, testClaim("org-a", "pending-late")); err != nil || n.CapacityBytes != 1<<30 {
		t.Fatalf("pending, WaitForFirstConsumer: %+v %v", n, err)
	}
	// A bound claim: its volume's modes (Status), not what it asked for.
	if st, err := b.EnsureClaim(ctx, testClaim("org-a", "bound-rwop")); err != nil || !slices.Equal(st.AccessModes, []string{"ReadWriteOncePod"}) {
		t.Fatalf("bound-rwop: %+v %v, want access modes [ReadWriteOncePod]", st, err)
	}
	// A sandbox finds it by its managed name; the Pod volume becomes the claim.
	spec := &runtime.Spec{ID: "s1", Meta: map[string]string{runtime.MetaOrg: "org-a"}, Volumes: []runtime.Volume{
		{Name: "scratch"}, {Name: "data", Managed: runtime.ManagedVolumeName("org-a", "granted")}}}
	claims, _, err := b.resolveClaims(ctx, spec)
	if err != nil || claims[1] != "granted" || len(claims) != 1 {
		t.Fatalf("resolve: %v %v", claims, err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "vol-0"}, {Name: "vol-1"}, {Name: "bin"}}}}
	applyClaims(pod, claims)
	if pvc := pod.Spec.Volumes[1].PersistentVolumeClaim; pvc == nil || pvc.ClaimName != "granted" || pod.Spec.Volumes[0].PersistentVolumeClaim != nil {
		t.Errorf("pod volumes: %+v", pod.Spec.Volumes)
	}
	// Another organization's sandbox naming the same managed name finds nothing.
	spec.Meta[runtime.MetaOrg] = "org-b"
	if _, _, err := b.resolveClaims(ctx, spec); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("org-b resolving: %v", err)
	}
	// Letting go of an adopted claim keeps it.
	if err := b.RemoveClaim(ctx, testClaim("org-a", "granted")); err != nil {
		t.Fatal(err)
	}
	pvc, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "granted", metav1.GetOptions{})
	if err != nil || pvc.Labels[LabelRegisteredVolume] != "" || pvc.Labels[LabelVolumeOrg] == "" {
		t.Errorf("adopted claim after RemoveClaim: %v %v", pvc.Labels, err)
	}
	if err := b.RemoveClaim(ctx, testClaim("org-a", "runner-data")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("sbx").Get(ctx, "runner-data", metav1.GetOptions{}); err != nil {
		t.Errorf("foreign claim touched: %v", err)
	}
}

func TestSecretRefs(t *testing.T) {
	ctx := context.Background()
	secret := func(name string, lbls map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", Labels: lbls}, Data: map[string][]byte{"token": []byte("s3cret")}}
	}
	b, _ := newFakeBackend(t, Config{},
		secret("granted", map[string]string{LabelSecretStoreOrg: runtime.OrgHash("org-a"), LabelSecretStore: "kube"}),
		secret("runner-own", nil),
		secret("other-store", map[string]string{LabelSecretStoreOrg: runtime.OrgHash("org-a"), LabelSecretStore: "other"}),
		secret("other-org", map[string]string{LabelSecretStoreOrg: runtime.OrgHash("org-b"), LabelSecretStore: "kube"}),
	)
	spec := func(secretName, key string) *runtime.Spec {
		s := &runtime.Spec{ID: "s1", Meta: map[string]string{runtime.MetaOrg: "org-a"}}
		s.SecretRefs = []runtime.SecretRef{{EnvVar: "TOKEN", Store: "kube", Secret: secretName, Key: key}}
		return s
	}
	if err := b.CheckSecretRefs(ctx, spec("granted", "token")); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"granted", "nokey"}, {"runner-own", "token"}, {"other-store", "token"}, {"other-org", "token"}, {"missing", "token"}, {"Bad_Name", "token"}, {"a/b", "token"}, {"granted", "../x"}, {"", "token"}} {
		err := b.CheckSecretRefs(ctx, spec(c[0], c[1]))
		if !errors.Is(err, runtime.ErrSecretRefNotGranted) {
			t.Errorf("%v: %v, want not granted", c, err)
		}
	}
	s := spec("granted", "token")
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: containerMain}}}}
	applySecretRefs(pod, s)
	if len(pod.Spec.Containers[0].Env) != 0 {
		t.Errorf("gate got env: %+v", pod.Spec.Containers[0].Env)
	}
	env := pod.Spec.Containers[1].Env
	if len(env) != 1 || env[0].Name != "TOKEN" || env[0].Value != "" || env[0].ValueFrom.SecretKeyRef.Name != "granted" || env[0].ValueFrom.SecretKeyRef.Key != "token" {
		t.Errorf("main env: %+v", env)
	}
}

// TestSecretRefsMulti: in a multi-container spec every container that names a store
// (an init container too) gets its own references in its own Pod container, under its
// Pod name (a reserved name is prefixed), and its agent config names the variables only.
func TestSecretRefsMulti(t *testing.T) {
	ref := func(env string) []runtime.SecretRef {
		return []runtime.SecretRef{{EnvVar: env, Store: "kube", Secret: "granted", Key: "k"}}
	}
	s := &runtime.Spec{ID: "s1",
		Container:      runtime.Container{Name: "app", SecretRefs: ref("A")},
		Sidecars:       []runtime.Container{{Name: "gate", SecretRefs: ref("B")}, {Name: "plain"}},
		InitContainers: []runtime.Container{{Name: "init", SecretRefs: ref("C")}},
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: containerInstall}, {Name: "init"}},
		Containers:     []corev1.Container{{Name: containerGate}, {Name: containerMain}, {Name: "c2-gate"}, {Name: "plain"}},
	}}
	applySecretRefs(pod, s)
	got := map[string]string{}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "granted" {
				t.Errorf("%s: %+v", c.Name, e)
			}
			got[c.Name] += e.Name
		}
	}
	if want := map[string]string{"init": "C", containerMain: "A", "c2-gate": "B"}; !maps.Equal(got, want) {
		t.Errorf("env by Pod container %v, want %v", got, want)
	}
	if n := secretRefNames(&s.Sidecars[0]); !slices.Equal(n, []string{"B"}) {
		t.Errorf("names %v", n)
	}
}

// TestSingleNodeClaims: a Pod mounting a ReadWriteOnce claim that a live sandbox Pod
// mounts goes to that Pod's node (required node affinity on the node's name); a
// ReadWriteOncePod claim in use is refused naming the holder; a ReadWriteMany claim, an
// ended holder and the sandbox's own Pod do not count.
func TestSingleNodeClaims(t *testing.T) {
	ctx := context.Background()
	pod := func(name, sandbox, node string, phase corev1.PodPhase, claims ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx", Labels: map[string]string{LabelManagedBy: ManagedBy, LabelSandbox: sandbox}},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
		for _, c := range claims {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
		}
		return p
	}
	b, _ := newFakeBackend(t, Config{Namespace: "sbx"},
		pod("sbx-a", "a", "node-a", corev1.PodRunning, "rwo", "rwx"),
		pod("sbx-b", "b", "node-b", corev1.PodSucceeded, "rwo", "rwop"),
		pod("sbx-c", "c", "node-c", corev1.PodRunning, "rwop"),
		pod("sbx-d", "d", "node-d", corev1.PodRunning, "rwo2"),
	)
	for _, tc := range []struct {
		modes []corev1.PersistentVolumeAccessMode
		want  corev1.PersistentVolumeAccessMode
	}{
		{[]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, corev1.ReadWriteOnce},
		{[]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}, corev1.ReadWriteOncePod},
		{[]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}, ""},
		{[]corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}, ""},
	} {
		if got := singleNodeMode(tc.modes); got != tc.want {
			t.Errorf("singleNodeMode(%v) = %q, want %q", tc.modes, got, tc.want)
		}
	}
	rwo, rwop := corev1.ReadWriteOnce, corev1.ReadWriteOncePod
	if n, err := b.claimNode(ctx, "new", map[string]corev1.PersistentVolumeAccessMode{"rwo": rwo}); err != nil || n != "node-a" {
		t.Errorf("rwo: %q, %v; want node-a", n, err)
	}
	if n, err := b.claimNode(ctx, "a", map[string]corev1.PersistentVolumeAccessMode{"rwo": rwo}); err != nil || n != "" {
		t.Errorf("own Pod: %q, %v", n, err)
	}
	if n, err := b.claimNode(ctx, "new", map[string]corev1.PersistentVolumeAccessMode{"unused": rwo}); err != nil || n != "" {
		t.Errorf("unmounted: %q, %v", n, err)
	}
	_, err := b.claimNode(ctx, "new", map[string]corev1.PersistentVolumeAccessMode{"rwop": rwop})
	if !errors.Is(err, runtime.ErrClaimIneligible) || !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "sandbox c mounts it") {
		t.Errorf("rwop in use: %v", err)
	}
	_, err = b.claimNode(ctx, "new", map[string]corev1.PersistentVolumeAccessMode{"rwo": rwo, "rwo2": rwo})
	if !errors.Is(err, runtime.ErrClaimIneligible) || !strings.Contains(err.Error(), "different nodes") {
		t.Errorf("two nodes: %v", err)
	}
	p := &corev1.Pod{}
	pinToNode(p, "node-a")
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Key != "metadata.name" || terms[0].MatchFields[0].Values[0] != "node-a" {
		t.Errorf("affinity %+v", p.Spec.Affinity)
	}
	pinToNode(p, "")
	if len(p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields) != 1 {
		t.Error("an empty node changed the affinity")
	}
}

// TestClaimSize: an existing claim granted to the organization has the larger of its
// capacity and its request; a missing one, or one not granted to it, has 0.
func TestClaimSize(t *testing.T) {
	grant := map[string]string{LabelVolumeOrg: runtime.OrgHash("org-a")}
	b, _ := newFakeBackend(t, Config{},
		existingClaim("bound", "std", grant, corev1.ClaimBound, "5Gi"),
		existingClaim("pending", "std", grant, corev1.ClaimPending, ""),
		existingClaim("foreign", "std", nil, corev1.ClaimBound, "5Gi"))
	for name, want := range map[string]int64{"bound": 5 << 30, "pending": 1 << 30, "foreign": 0, "missing": 0} {
		if got, err := b.ClaimSize(context.Background(), testClaim("org-a", name)); err != nil || got != want {
			t.Errorf("%s: %d, %v; want %d", name, got, err, want)
		}
	}
}
