package k8s

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// staticVolume makes a StorageClass without a provisioner and one hostPath
// PersistentVolume of it, which a claim of the class binds (the test cluster has no
// dynamic provisioner; a real cluster's class provisions volumes itself). Both are
// removed at cleanup. It returns the class.
func staticVolume(t *testing.T, s *stack.KubernetesStack, ctx context.Context, size string) string {
	t.Helper()
	class := randomID("sbx-test-")
	immediate := storagev1.VolumeBindingImmediate
	if _, err := s.Client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pv")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o777)
	hostPathType := corev1.HostPathDirectory
	if _, err := s.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:              class,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = s.Client.CoreV1().PersistentVolumes().Delete(ctx, class, metav1.DeleteOptions{})
		_ = s.Client.StorageV1().StorageClasses().Delete(ctx, class, metav1.DeleteOptions{})
	})
	return class
}

// TestPVCVolume: the test cluster has no dynamic provisioner, so the test makes a
// StorageClass without one and a hostPath PersistentVolume of it that the claim binds
// (a real cluster's class provisions volumes itself).
func TestPVCVolume(t *testing.T) {
	c, s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	class := staticVolume(t, s, ctx, "1Gi")
	org := "org-" + class
	claim := randomID("vol-")
	vol := runner.RegisteredVolume{Org: org, ClaimName: claim, Namespace: c.namespace, SizeBytes: 1 << 30,
		StorageClass: class, AllowedStorageClasses: []string{class}}
	t.Cleanup(func() {
		_ = s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Delete(context.Background(), claim, metav1.DeleteOptions{})
	})

	// A foreign namespace is refused with a field violation.
	foreign := vol
	foreign.Namespace = "default"
	if _, err := s.Runner.EnsureVolume(ctx, foreign); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Fatalf("foreign namespace: %v, want %s", err, apierr.VolumeRunnerIneligible)
	} else if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "volume.spec.pvc.namespace" {
		t.Errorf("foreign namespace violations: %+v", vs)
	}
	t0 := time.Now()
	n, err := s.Runner.EnsureVolume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim %s made and bound to the static volume in %s", claim, time.Since(t0).Round(time.Millisecond))
	if n.CapacityBytes != 1<<30 {
		t.Errorf("capacity %d, want 1Gi from the bound claim", n.CapacityBytes)
	}
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || pvc.Status.Phase != corev1.ClaimBound || pvc.Labels[kubernetes.LabelVolumeOrg] != runtime.OrgHash(org) {
		t.Fatalf("claim: %v %+v", err, pvc)
	}
	// Another organization cannot take it.
	other := vol
	other.Org = "another-org"
	if _, err := s.Runner.EnsureVolume(ctx, other); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Errorf("another organization adopting the claim: %v", err)
	}

	run := func(script string, readOnly bool, sub string) string {
		t.Helper()
		sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
			Container: runtime.Container{Image: busybox, Command: "sh", Args: []string{"-c", script + "; exec sleep 3600"},
				VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data", ReadOnly: readOnly, SubPath: sub}}},
			Volumes: []runtime.Volume{{Name: "data", Managed: vol.ManagedName()}},
			Meta:    map[string]string{runtime.MetaOrg: org},
		}})
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, s.Runner, sb.ID, 2*time.Minute, running)
		if got, _ := s.Runner.Get(sb.ID); got.State != runner.StateRunning {
			t.Fatalf("sandbox %s: %s %s %s", sb.ID, got.State, got.Reason, got.Message)
		}
		return sb.ID
	}
	first := run("true", false, "")
	if res := exec(t, s.Runner, first, "sh", "-c", "mkdir -p /data/sub && echo persisted > /data/sub/file && cat /data/sub/file"); res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "persisted") {
		t.Fatalf("write: %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if _, err := s.Runner.Delete(first, time.Second); err != nil {
		t.Fatal(err)
	}
	terminal(t, s.Runner, first)
	second := run("true", true, "sub")
	if res := exec(t, s.Runner, second, "cat", "/data/file"); res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "persisted" {
		t.Fatalf("read in the next sandbox (sub_path, read-only): %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := exec(t, s.Runner, second, "sh", "-c", "echo x > /data/other"); res.ExitCode == 0 {
		t.Errorf("read-only mount written")
	}
	// Deleting the volume while a sandbox mounts it is refused; then it deletes the claim.
	if err := s.Runner.DeleteVolume(ctx, vol, false); apierr.Reason(err) != apierr.VolumeInUse {
		t.Errorf("delete in use: %v", err)
	}
	if _, err := s.Runner.Delete(second, time.Second); err != nil {
		t.Fatal(err)
	}
	terminal(t, s.Runner, second)
	if err := s.Runner.DeleteVolume(ctx, vol, false); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(time.Minute)
	for {
		_, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("claim still there after DeleteVolume: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestKubernetesSecretStore(t *testing.T) {
	c, s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	org := randomID("org-")
	granted, plain := randomID("granted-"), randomID("plain-")
	for name, lbls := range map[string]map[string]string{
		granted: {kubernetes.LabelSecretStoreOrg: runtime.OrgHash(org), kubernetes.LabelSecretStore: "kube"},
		plain:   nil,
	} {
		if _, err := s.Client.CoreV1().Secrets(c.namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}, Data: map[string][]byte{"token": []byte("value-of-" + name)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.Client.CoreV1().Secrets(c.namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	spec := func(secret string) runtime.Spec {
		return runtime.Spec{
			Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"},
				SecretRefs: []runtime.SecretRef{{EnvVar: "TOKEN", Store: "kube", Secret: secret, Key: "token"}}},
			Meta: map[string]string{runtime.MetaOrg: org},
		}
	}
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: spec(granted)})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.Runner, sb.ID, 2*time.Minute, running)
	if res := exec(t, s.Runner, sb.ID, "sh", "-c", "echo $TOKEN"); strings.TrimSpace(string(res.Stdout)) != "value-of-"+granted {
		t.Errorf("TOKEN = %q, want the granted Secret's value", res.Stdout)
	}
	// The Pod holds the reference, not the value.
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range pod.Spec.Containers {
		for _, e := range ct.Env {
			if strings.Contains(e.Value, "value-of-") {
				t.Errorf("the Pod spec holds the value: %+v", e)
			}
		}
	}
	// Not granted, missing, and a key it lacks: the same refusal before anything is made.
	var msgs []string
	for _, name := range []string{plain, "no-such-secret"} {
		_, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: spec(name)})
		if apierr.Reason(err) != apierr.SecretNotProvisioned {
			t.Fatalf("%s: %v, want %s", name, err, apierr.SecretNotProvisioned)
		}
		msgs = append(msgs, strings.ReplaceAll(err.Error(), name, "X"))
	}
	if msgs[0] != msgs[1] {
		t.Errorf("not granted and missing differ: %q vs %q", msgs[0], msgs[1])
	}
}

// TestSecurityKubernetesSecretsAndClaims (attack): a tenant names the runner's own
// Secrets and claims, another organization's, and a Secret granted to another store of
// its own organization. Every one is refused before a Pod exists, with the same answer
// as a Secret that does not exist; the claims are left as they were.
func TestSecurityKubernetesSecretsAndClaims(t *testing.T) {
	c, s, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	victim, attacker := randomID("victim-"), randomID("attacker-")
	// A live sandbox of the victim: its agent-key Secret sbx-<id> is in the namespace.
	vsb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}}, Meta: map[string]string{runtime.MetaOrg: victim}}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, s.Runner, vsb.ID, 2*time.Minute, running)
	victimSecret := randomID("victim-secret-")
	otherStore := randomID("other-store-")
	for name, lbls := range map[string]map[string]string{
		victimSecret: {kubernetes.LabelSecretStoreOrg: runtime.OrgHash(victim), kubernetes.LabelSecretStore: "kube"},
		otherStore:   {kubernetes.LabelSecretStoreOrg: runtime.OrgHash(attacker), kubernetes.LabelSecretStore: "other"},
	} {
		if _, err := s.Client.CoreV1().Secrets(c.namespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}, Data: map[string][]byte{"token": []byte("stolen")},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.Client.CoreV1().Secrets(c.namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	before := podCount(t, s, c)
	for _, target := range []struct{ secret, key string }{
		{"sbx-" + vsb.ID, "client.key"},       // the victim sandbox's agent client key
		{victimSecret, "token"},               // granted to the victim's store "kube"
		{otherStore, "token"},                 // the attacker's own org, but another store
		{"default-token", "token"},            // a name that does not exist
		{"sbx-" + vsb.ID + "/x", "spec.json"}, // a path no Secret name can be
	} {
		_, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
			Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"},
				SecretRefs: []runtime.SecretRef{{EnvVar: "LOOT", Store: "kube", Secret: target.secret, Key: target.key}}},
			Meta: map[string]string{runtime.MetaOrg: attacker}}})
		if apierr.Reason(err) != apierr.SecretNotProvisioned {
			t.Errorf("secret %s: %v, want %s", target.secret, err, apierr.SecretNotProvisioned)
		}
	}
	if after := podCount(t, s, c); after != before {
		t.Errorf("pods %d → %d: a refused create made a Pod", before, after)
	}
	// Claims: the attacker cannot adopt a claim the runner's namespace holds for anyone
	// else (one without a grant; one made for the victim's volume).
	plain := randomID("plain-claim-")
	if _, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: plain},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Delete(context.Background(), plain, metav1.DeleteOptions{})
	})
	vol := runner.RegisteredVolume{Org: attacker, ClaimName: plain, Namespace: c.namespace}
	if _, err := s.Runner.EnsureVolume(ctx, vol); apierr.Reason(err) != apierr.VolumeRunnerIneligible {
		t.Errorf("adopting an ungranted claim: %v", err)
	}
	if err := s.Runner.DeleteVolume(ctx, vol, true); err != nil {
		t.Errorf("delete: %v", err)
	}
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, plain, metav1.GetOptions{})
	if err != nil || len(pvc.Labels) != 0 || pvc.DeletionTimestamp != nil {
		t.Errorf("the claim was touched: %v %+v", err, pvc)
	}
	// A sandbox naming another organization's registered volume by its managed name finds
	// no claim: the create fails and no Pod mounts it.
	victimVol := runner.RegisteredVolume{Org: victim, ClaimName: plain, Namespace: c.namespace}
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"},
			VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/v"}}},
		Volumes: []runtime.Volume{{Name: "v", Managed: victimVol.ManagedName()}},
		Meta:    map[string]string{runtime.MetaOrg: attacker}}})
	if err == nil {
		if got := terminal(t, s.Runner, sb.ID); got.State != runner.StateFailed || !strings.Contains(got.Message, "no claim") {
			t.Errorf("mounting another organization's volume: %s %s %s", got.State, got.Reason, got.Message)
		}
	}
}

// podCount counts the sandbox Pods in the namespace.
func podCount(t *testing.T, s *stack.KubernetesStack, c cluster) int {
	t.Helper()
	l, err := s.Client.CoreV1().Pods(c.namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelManagedBy + "=" + kubernetes.ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// TestPVCVolumeThroughGateway: VolumeService and CreateSandbox through a gateway that
// reaches the Kubernetes runner over the runner wire, the runner checking its own policy
// (base.volume_storage_class, constraints.volumes.allowed_storage_classes): a volume in
// another namespace is refused at once with a field violation; one in the runner's
// namespace goes READY with the bound claim's capacity (10 GiB, the default size); a sandbox mounting it gets the
// claim as a Pod volume; deleting the volume deletes the claim.
func TestPVCVolumeThroughGateway(t *testing.T) {
	c, s, runnerID := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The gateway sends no size: the runner's default, 10 GiB (hostPath does not hold to it).
	class := staticVolume(t, s, ctx, "10Gi")
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := runnerapi.ServerTLSConfig(ca, runnerID, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	doc := `{"base": {"volume_storage_class": "` + class + `"}, "constraints": {"volumes": {"allowed_storage_classes": ["` + class + `"]}}}`
	srv := runnerapi.NewServer(runnerID, s.Runner, nil).WithPolicy(runnerID, policyMap{runnerID: doc}).HTTPServer(scfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	ccfg, err := runnerapi.ClientTLSConfig(ca, "gw1", runnerID)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: runnerID, Addr: ln.Addr().String(), TLS: ccfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	org := randomID("org-")
	if _, err := st.Orgs().Create(ctx, store.Org{ID: org, Name: org}); err != nil {
		t.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{rc}, Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(),
		Policies: policyMap{runnerID: doc}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	admin := auth.WithPrincipal(ctx, auth.Principal{KeyID: "admin", Org: org, Role: auth.RoleAdmin})
	claim := randomID("gwvol-")
	t.Cleanup(func() {
		_ = s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Delete(context.Background(), claim, metav1.DeleteOptions{})
	})
	volume := func(ns string) *sandboxv1.Volume {
		return &sandboxv1.Volume{VolumeId: "data", Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{
			RunnerId: runnerID, Namespace: ns, ClaimName: claim}}}}
	}
	_, err = g.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: volume("default")}))
	if vs := apierr.Violations(err); apierr.Reason(err) != apierr.VolumeRunnerIneligible || len(vs) != 1 || vs[0].Field != "volume.spec.pvc.namespace" {
		t.Fatalf("namespace default: %v %+v", err, vs)
	}
	if _, err := g.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: volume(c.namespace)})); err != nil {
		t.Fatal(err)
	}
	var v *sandboxv1.Volume
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		res, err := g.GetVolume(admin, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"}))
		if err != nil {
			t.Fatal(err)
		}
		if v = res.Msg; v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(end) {
			break
		}
	}
	if v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || v.GetStatus().GetCapacity() != "10Gi" {
		t.Fatalf("volume: %v", v.GetStatus())
	}
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != class {
		t.Fatalf("claim of the policy's class: %v %+v", err, pvc)
	}
	res, err := g.CreateSandbox(admin, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "sleep", Args: []string{"3600"},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data"}}}},
		Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "data"}}},
	}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetSandboxId()
	waitState(t, s.Runner, id, 2*time.Minute, running)
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(pv corev1.Volume) bool {
		return pv.PersistentVolumeClaim != nil && pv.PersistentVolumeClaim.ClaimName == claim
	}) {
		t.Errorf("pod volumes %+v: no claim %s", pod.Spec.Volumes, claim)
	}
	if r := exec(t, s.Runner, id, "sh", "-c", "echo hi > /data/f && cat /data/f"); strings.TrimSpace(string(r.Stdout)) != "hi" {
		t.Errorf("write to the claim: %q %q", r.Stdout, r.Stderr)
	}
	if _, err := g.DeleteSandbox(admin, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	terminal(t, s.Runner, id)
	// Refused (CWSANDBOX_VOLUME_IN_USE) until the gateway has seen the sandbox end.
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, _ = g.GetSandbox(admin, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		_, err := g.DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data"}))
		if err == nil {
			break
		}
		if apierr.Reason(err) != apierr.VolumeInUse || time.Now().After(end) {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := s.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatal("claim still there after DeleteVolume")
		}
	}
}
