package kubernetes

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// TestRecoverIPWaitBounded: Recover waits for the kubelet to report the IP of scheduled,
// not yet running Pods (a create that took its hello) within one shared deadline, not
// recoverIPWait per Pod, and not at all for a Pod older than StartTimeout.
func TestRecoverIPWaitBounded(t *testing.T) {
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	lb, _ := newFakeBackend(t, Config{})
	mk := func(id string, created time.Time) []k8sruntime.Object {
		spec := &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sh"}}
		objs := recoverWriter(t, lb, spec, []corev1.ContainerStatus{{Name: containerGate, State: waiting}, {Name: containerMain, State: waiting}}, nil)
		pod := objs[1].(*corev1.Pod)
		pod.CreationTimestamp = metav1.NewTime(created)
		pod.Spec.NodeName = "n1"
		pod.Status.Phase = corev1.PodPending
		return objs
	}
	for _, tc := range []struct {
		name    string
		created time.Duration // before now
		max     time.Duration
	}{
		{"young Pods share one deadline", 0, recoverIPWait + 2*time.Second},
		{"old Pods are not waited for", time.Hour, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []k8sruntime.Object
			for _, id := range []string{"a1", "a2", "a3", "a4"} {
				objs = append(objs, mk(id, time.Now().Add(-tc.created))...)
			}
			b, _ := newFakeBackend(t, Config{StartTimeout: 10 * time.Minute}, objs...)
			start := time.Now()
			recs, err := b.Recover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > tc.max {
				t.Errorf("Recover of 4 Pods without an IP took %s, want <= %s", d, tc.max)
			}
			if len(recs) != 4 {
				t.Fatalf("recovered %d, want 4", len(recs))
			}
			for _, r := range recs {
				if r.Alive {
					t.Errorf("%s alive without an agent", r.Spec.ID)
				}
			}
		})
	}
}

// TestRecoverWarmClaimIPLate: a warm claim cut short by a restart within the kubelet's
// relist of its Pod's start (the listed Pod has no IP; the IP comes through the watch
// during Recover's wait) whose agent still holds the main command in standby is
// vanished, not re-adopted as running with no main command: the standby check uses the
// Pod as the wait left it.
func TestRecoverWarmClaimIPLate(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const id = "wc1"
	dir := t.TempDir()
	_, clientPEM, clientKeyPEM, err := selfSigned("sandboxd-runner")
	if err != nil {
		t.Fatal(err)
	}
	_, serverPEM, serverKeyPEM, err := selfSigned("sandbox-" + id)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": serverPEM, "tls.key": serverKeyPEM, "client.crt": clientPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ident := agent.NewIdentity(id)
	a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(a))
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln := agentListener(t, filepath.Join(dir, "primary.sock"), ident)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	dial := startGate(t, ctx, dir, gate.ServeOptions{})

	lb, _ := newFakeBackend(t, Config{})
	spec := &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "sh"}}
	specJSON, _ := json.Marshal(spec)
	acfg, _ := json.Marshal(&agentconfig.Config{Standby: true, Identity: ident})
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx", Labels: lb.labels(spec)},
		Data: map[string][]byte{secretSpec: specJSON, secretClientCert: clientPEM, secretClientKey: clientKeyPEM,
			gate.TLSCertFile: serverPEM, gate.ConfigFile: acfg}}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: types.UID("u-" + id),
		Labels: lb.labels(spec), CreationTimestamp: metav1.Now(),
		Annotations: map[string]string{annotationWarmClaimed: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: containerGate, State: waiting}, {Name: containerMain, State: waiting}}}}
	b, cs := newFakeBackend(t, Config{StartTimeout: 10 * time.Minute,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) { return dial(ctx, network, "") }}, sec, pod)

	// The kubelet's report comes while Recover waits for it.
	go func() {
		for {
			b.mu.Lock()
			s := b.sandboxes[id]
			b.mu.Unlock()
			if s != nil || ctx.Err() != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		p := pod.DeepCopy()
		p.Status.PodIP = "10.0.0.9"
		if _, err := cs.CoreV1().Pods("sbx").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	}()
	recs, err := b.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("recovered %d, want 1", len(recs))
	}
	if r := recs[0]; r.Alive || r.Exit == nil || r.Exit.Reason != "Vanished" {
		t.Errorf("a warm claim cut short, its agent in standby: %+v (exit %+v); want vanished", r, r.Exit)
	}
	if n := a.startCount(); n != 0 {
		t.Errorf("%d Starts", n)
	}
}
