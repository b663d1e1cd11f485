package security

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// TestK8sForgedPrimaryStatus: on a Kubernetes runner the primary container's final
// status is the gate's copy of the agent's status.json, a file in the run emptyDir the
// sandbox's workload can write. A workload that forges it (a platform reason claiming it
// was OOM-killed or evicted, restarts beyond its limit, an escape-laden message, an end
// time long before it started) ends with what its own command could have said: the
// runner recovering the ended Pod reports reason Error, restarts at the spec's limit, no
// message, and the kubelet's end time. (The Pod as the cluster reports it; the sandbox's
// Secret as the backend keeps it: spec, pinned keys, agent config.)
func TestK8sForgedPrimaryStatus(t *testing.T) {
	const id, runner = "forged1", "r1"
	spec := runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sh", RestartLimit: 2},
		Meta: map[string]string{runtime.MetaOrg: "org-a"}}
	started := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	ended := started.Add(10 * time.Minute)
	forged := `{"state":"MAIN_STATE_COMPLETED","exitCode":0,"restartCount":1000000,"reason":"Evicted",` +
		`"message":"\u001b]8;;https://evil.example\u0007the node was drained by the operator\u001b]8;;\u0007` + strings.Repeat("!", 2000) + `",` +
		`"finishedAt":"1999-01-01T00:00:00Z"}`
	b, ex := recoverEnded(t, runner, spec, corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "gate", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", Message: forged,
			StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(ended)}}},
		{Name: "sandbox", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed",
			StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(ended)}}},
	}})
	if ex.Reason != "Error" || ex.Restarts != 2 || ex.Message != "" || !ex.At.Equal(ended) || ex.ExitCode == nil || *ex.ExitCode != 0 {
		t.Errorf("exit of the forged status: %+v, want reason Error (not Evicted), 2 restarts (the limit), no message, at the kubelet's end %s", ex, ended)
	}
	if !textclip.AllPrintable(ex.Message) {
		t.Errorf("message %q is not printable", ex.Message)
	}
	if w, err := b.Wait(t.Context(), id); err != nil || w.Reason != ex.Reason || w.Restarts != ex.Restarts {
		t.Errorf("Wait = %+v, %v, want the recovered exit", w, err)
	}
}

// selfSignedPEM is a self-signed P-256 certificate and its key, PEM.
func selfSignedPEM(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
