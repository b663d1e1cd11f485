package kubernetes

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// testRootsPEM is a self-signed CA certificate, PEM.
func testRootsPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestEgressRootsPerRunner: two runners sharing a namespace each write their own roots
// ConfigMap, labelled with the runner, and each Pod projects its runner's; a second
// start with other roots updates the ConfigMap.
func TestEgressRootsPerRunner(t *testing.T) {
	cs := fake.NewSimpleClientset()
	ra, rb := testRootsPEM(t, "a"), testRootsPEM(t, "b")
	for _, w := range []struct {
		runner string
		roots  []byte
	}{{"runner-a", ra}, {"runner-b", rb}} {
		e := testEgress()
		e.Roots = w.roots
		if _, err := New(t.Context(), Config{Client: cs, Namespace: "sbx", RunnerID: w.runner, AgentImage: "agent:1", Egress: e, MaxPrepull: -1}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(runner string, roots []byte) {
		t.Helper()
		name := gate.EgressRootsConfigMapName(runner)
		if name != "sandboxd-egress-roots-"+runner {
			t.Errorf("name %q", name)
		}
		cm, err := cs.CoreV1().ConfigMaps("sbx").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data[gate.EgressRootsFile] != string(roots) || cm.Labels[LabelRunner] != runner || cm.Labels[LabelManagedBy] != ManagedBy {
			t.Errorf("ConfigMap %s: labels %v, roots %.40q", name, cm.Labels, cm.Data[gate.EgressRootsFile])
		}
	}
	check("runner-a", ra)
	check("runner-b", rb)

	// Update: runner-a restarts with other roots.
	ra2 := testRootsPEM(t, "a2")
	if err := writeEgressRoots(t.Context(), cs, "sbx", "runner-a", ra2); err != nil {
		t.Fatal(err)
	}
	check("runner-a", ra2)
	check("runner-b", rb)

	// Each Pod projects its own runner's ConfigMap.
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: "main"}}}}
	applyEgressSecretsPod(pod, egressSecretSpec("s1"), "runner-b")
	found := false
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ConfigMap != nil {
				found = true
				if src.ConfigMap.Name != "sandboxd-egress-roots-runner-b" {
					t.Errorf("Pod projects ConfigMap %q", src.ConfigMap.Name)
				}
			}
		}
	}
	if !found {
		t.Error("no roots ConfigMap projected")
	}

	// A runner ID that is no DNS label: a hash, still a valid name.
	if n := gate.EgressRootsConfigMapName("Runner_A"); !strings.HasPrefix(n, gate.EgressRootsConfigMapPrefix) || len(n) != len(gate.EgressRootsConfigMapPrefix)+16 || strings.ContainsAny(n, "R_") {
		t.Errorf("name for Runner_A: %q", n)
	}
}

// TestWriteEgressRootsRaces: a ConfigMap made between the Get and the Create
// (AlreadyExists), and an Update conflicting with another writer, are retried.
func TestWriteEgressRootsRaces(t *testing.T) {
	roots := testRootsPEM(t, "r")
	name := gate.EgressRootsConfigMapName("r1")
	t.Run("already-exists", func(t *testing.T) {
		cs := fake.NewSimpleClientset()
		creates := 0
		cs.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
			creates++
			if creates == 1 { // another replica made it first
				_, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), "sbx", name)
				if apierrors.IsNotFound(err) {
					_ = cs.Tracker().Add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx"}, Data: map[string]string{gate.EgressRootsFile: "old"}})
				}
				return true, nil, apierrors.NewAlreadyExists(corev1.Resource("configmaps"), name)
			}
			return false, nil, nil
		})
		if err := writeEgressRoots(t.Context(), cs, "sbx", "r1", roots); err != nil {
			t.Fatal(err)
		}
		cm, err := cs.CoreV1().ConfigMaps("sbx").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || cm.Data[gate.EgressRootsFile] != string(roots) || cm.Labels[LabelRunner] != "r1" {
			t.Fatalf("after AlreadyExists: %v %+v", err, cm)
		}
	})
	t.Run("conflict", func(t *testing.T) {
		cs := fake.NewSimpleClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sbx"}, Data: map[string]string{gate.EgressRootsFile: "old"}})
		updates := 0
		cs.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
			updates++
			if updates == 1 {
				return true, nil, apierrors.NewConflict(corev1.Resource("configmaps"), name, nil)
			}
			return false, nil, nil
		})
		if err := writeEgressRoots(t.Context(), cs, "sbx", "r1", roots); err != nil {
			t.Fatal(err)
		}
		cm, err := cs.CoreV1().ConfigMaps("sbx").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || cm.Data[gate.EgressRootsFile] != string(roots) || updates != 2 {
			t.Fatalf("after a conflict: %v, %d updates, %+v", err, updates, cm)
		}
	})
}

// TestEgressRootsNotPEM: New refuses roots that hold no PEM certificate, or too many
// bytes, naming the file they came from (the runner's log is where a chart user whose
// egress.roots is no bundle learns why the runner does not start), or the system bundle.
func TestEgressRootsNotPEM(t *testing.T) {
	notPEM := []byte("-----BEGIN CERTIFICATE-----\nnot base64 DER\n-----END CERTIFICATE-----\n")
	for _, c := range []struct {
		roots []byte
		file  string
		want  string
	}{
		{notPEM, "/etc/sandboxd/egress-roots/roots.pem", "kubernetes backend: Egress: the roots bundle --egress-roots /etc/sandboxd/egress-roots/roots.pem holds no PEM certificate"},
		{notPEM, "", "the roots bundle (the system bundle the runner found) holds no PEM certificate"},
		{make([]byte, MaxEgressRoots+1), "/r.pem", fmt.Sprintf("the roots bundle --egress-roots /r.pem has %d bytes, at most %d", MaxEgressRoots+1, MaxEgressRoots)},
	} {
		e := testEgress()
		e.Roots, e.RootsFile = c.roots, c.file
		_, err := New(t.Context(), Config{Client: fake.NewSimpleClientset(), Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1", Egress: e, MaxPrepull: -1})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with roots of %q: %v, want %q", c.file, err, c.want)
		}
	}
}

// TestEgressRootsForbidden: a runner upgraded before its Role (no rule for configmaps)
// starts with host-name rules on and egress secrets off, says why once in its log, and
// refuses a spec with egress secrets naming the missing rule.
func TestEgressRootsForbidden(t *testing.T) {
	cs := fake.NewSimpleClientset()
	cs.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), "", errors.New("RBAC: no rule"))
	})
	var logBuf bytes.Buffer
	e := testEgress()
	e.Roots = testRootsPEM(t, "r")
	b, err := New(t.Context(), Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1", Egress: e, MaxPrepull: -1,
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	if err != nil {
		t.Fatalf("New with a Role lacking configmaps: %v", err)
	}
	defer b.Close()
	if s := b.Support(); !s.NoEgressSecrets || s.NoDNSEgress {
		t.Errorf("Support %+v: want egress secrets off, host-name rules on", s)
	}
	if n := strings.Count(logBuf.String(), "egress secrets are off"); n != 1 || !strings.Contains(logBuf.String(), "configmaps") {
		t.Errorf("log (%d lines about it): %s", n, logBuf.String())
	}
	_, err = b.Create(t.Context(), egressSecretSpec("fb-1"))
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "sandboxd-egress-roots-r1") || !strings.Contains(err.Error(), "configmaps") {
		t.Errorf("Create with egress secrets: %v", err)
	}
	if err := b.checkEgress(hostNameSpec("fb-2", runtime.EgressRule{DNSName: "api.example.com"})); err != nil {
		t.Errorf("host-name rule without secrets: %v", err)
	}
}

// TestEgressSecretsDenyEgressRefused: an egress secret under deny-all egress is refused
// (it would grant nothing, and the Pod would not be held for its placeholders).
func TestEgressSecretsDenyEgressRefused(t *testing.T) {
	b, cs := newFakeBackend(t, Config{Egress: testEgress(), MaxPrepull: -1, StartTimeout: time.Second})
	spec := egressSecretSpec("deny-1")
	spec.Network.DenyEgress = true
	if _, err := b.Create(t.Context(), spec); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "deny") {
		t.Fatalf("Create: %v", err)
	}
	if secs, _ := cs.CoreV1().Secrets("sbx").List(t.Context(), metav1.ListOptions{}); len(secs.Items) != 0 {
		t.Errorf("%d Secrets made", len(secs.Items))
	}
}
