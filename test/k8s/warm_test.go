package k8s

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// warmTargetSpec is a template's resolved spec (its own command and env: a claim
// replaces them with the caller's).
func warmTargetSpec(org string) runtime.Spec {
	return runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}, Env: map[string]string{"FROM": "template"}},
		Network:   &runtime.Network{Egress: runtime.DefaultEgress()},
		Meta:      map[string]string{runtime.MetaOrg: org},
	}
}

func waitWarmReady(t testing.TB, s *stack.KubernetesStack, n int) {
	t.Helper()
	end := time.Now().Add(3 * time.Minute)
	for s.Backend.WarmStats().Ready < n {
		if time.Now().After(end) {
			t.Fatalf("warm pool: %+v after 3 min, want %d ready", s.Backend.WarmStats(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWarmPool: a warm target of size 1 gets a warm Pod; a Create of a matching spec
// claims it (the sandbox is named after it: hostname = its ID) and runs the caller's
// command, env and files, under the target's NetworkPolicy; the pool refills; a runner
// restart keeps the claimed sandbox (its recorded spec is the caller's) and deletes the
// warm Pod nobody claimed.
func TestWarmPool(t *testing.T) {
	c := needCluster(t)
	runnerID := randomID("warm-")
	dataDir := t.TempDir()
	s := newStack(t, c, runnerID, dataDir)
	t.Cleanup(func() {
		s.Close()
		deleteRunnerObjects(s.Client, c.namespace, runnerID)
	})
	ctx := context.Background()
	const org = "org-w"
	if err := s.Runner.SetWarmPools(ctx, []runtime.WarmTarget{{Key: org + "/tmpl", Spec: warmTargetSpec(org), Size: 1}}); err != nil {
		t.Fatal(err)
	}
	waitWarmReady(t, s, 1)
	pods := s.Client.CoreV1().Pods(c.namespace)
	warmSel := metav1.ListOptions{LabelSelector: kubernetes.LabelRunner + "=" + runnerID + "," + kubernetes.LabelWarm}
	list, err := pods.List(ctx, warmSel)
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("warm pods: %v (err %v), want 1", len(list.Items), err)
	}
	warmID := list.Items[0].Labels[kubernetes.LabelSandbox]

	// The caller's spec: the template's with its own command, env and files (as the
	// gateway sends it: its own ID, which the runner may replace).
	spec := warmTargetSpec(org)
	spec.ID = runner.NewID()
	spec.Command, spec.Args = "sh", []string{"-c", `echo "$GREETING" > /tmp/env-of-main; exec sleep 3600`}
	spec.Env = map[string]string{"GREETING": "hi there"}
	spec.Files = []runtime.File{{Path: "/etc/sandbox-note", Content: []byte("note\n"), Mode: 0o640}}
	spec.Meta[runtime.MetaCaller] = "key-w"
	spec.Meta[runtime.MetaAnyID] = "true"
	t0 := time.Now()
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if id != warmID {
		t.Fatalf("created %s, want the warm pod's id %s", id, warmID)
	}
	if sb := waitState(t, s.Runner, id, time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s)", sb.State, sb.Reason, sb.Message)
	}
	tRunning := time.Since(t0)
	first := exec(t, s.Runner, id, "true")
	ws := s.Backend.WarmStats()
	t.Logf("warm create → RUNNING %s, → first command: %s (exit %d); the claim in the backend: %s, from the create to its start %s, from its end to RUNNING %s",
		tRunning, time.Since(t0), first.ExitCode, ws.LastClaim, ws.LastClaimEnd.Sub(t0)-ws.LastClaim, tRunning-ws.LastClaimEnd.Sub(t0))
	if st := s.Backend.WarmStats(); st.Claims != 1 || st.Fallback != 0 {
		t.Errorf("warm stats %+v: want 1 claim", st)
	}
	for _, ck := range []struct{ name, argv, want string }{
		{"hostname", "hostname", id + "\n"},
		{"/etc/hostname", "cat /etc/hostname", id + "\n"},
		{"exec env", `echo "$GREETING|${FROM-unset}"`, "hi there|unset\n"},
		{"main command env", "until [ -s /tmp/env-of-main ]; do sleep 0.05; done; cat /tmp/env-of-main", "hi there\n"},
		{"file", "cat /etc/sandbox-note; stat -c %a /etc/sandbox-note", "note\n640\n"},
	} {
		if out := string(exec(t, s.Runner, id, "sh", "-c", ck.argv).Stdout); out != ck.want {
			t.Errorf("%s: %q, want %q", ck.name, out, ck.want)
		}
	}
	pod, err := pods.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Labels[kubernetes.LabelWarm]; ok || pod.Labels[kubernetes.LabelUser] == "" || pod.Labels[kubernetes.LabelOrg] != org {
		t.Errorf("claimed pod labels %v: want no warm label, the caller's and the org's", pod.Labels)
	}
	if pod.Spec.Hostname != id {
		t.Errorf("pod hostname %q", pod.Spec.Hostname)
	}
	np, err := s.Client.NetworkingV1().NetworkPolicies(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claimed sandbox's network policy: %v", err)
	} else if np.Spec.PodSelector.MatchLabels[kubernetes.LabelSandbox] != id || len(np.Spec.Egress) == 0 {
		t.Errorf("network policy %+v", np.Spec)
	} else if _, ok := np.Labels[kubernetes.LabelWarm]; ok || np.Labels[kubernetes.LabelUser] != pod.Labels[kubernetes.LabelUser] {
		t.Errorf("claimed network policy labels %v: want no warm label, the caller's", np.Labels)
	}
	sec, err := s.Client.CoreV1().Secrets(c.namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sec.Labels[kubernetes.LabelWarm]; ok {
		t.Errorf("claimed secret labels %v: want no warm label", sec.Labels)
	}
	// No object of the claimed sandbox keeps the warm label (a cleanup by it would take it).
	sbxSel := metav1.ListOptions{LabelSelector: kubernetes.LabelSandbox + "=" + id + "," + kubernetes.LabelWarm}
	if l, err := s.Client.CoreV1().Secrets(c.namespace).List(ctx, sbxSel); err != nil || len(l.Items) > 0 {
		t.Errorf("secrets of the claimed sandbox labelled warm: %d (%v)", len(l.Items), err)
	}
	if l, err := s.Client.NetworkingV1().NetworkPolicies(c.namespace).List(ctx, sbxSel); err != nil || len(l.Items) > 0 {
		t.Errorf("network policies of the claimed sandbox labelled warm: %d (%v)", len(l.Items), err)
	}
	var rec runtime.Spec
	if err := json.Unmarshal(sec.Data["spec.json"], &rec); err != nil || rec.Env["GREETING"] != "hi there" || rec.Meta[runtime.MetaCaller] != "key-w" {
		t.Errorf("recorded spec %+v (err %v): want the caller's", rec, err)
	}
	if _, ok := rec.Meta[runtime.MetaAnyID]; ok {
		t.Errorf("recorded spec keeps %s", runtime.MetaAnyID)
	}

	// The pool refills; another organization's create never gets its Pod.
	waitWarmReady(t, s, 1)
	other := warmTargetSpec("org-other")
	other.Meta[runtime.MetaAnyID] = "true"
	other.ID = runner.NewID()
	osb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: other})
	if err != nil {
		t.Fatal(err)
	}
	if osb.ID != other.ID {
		t.Errorf("another organization's create was named %s (a warm pod?), want its own %s", osb.ID, other.ID)
	}
	if st := s.Backend.WarmStats(); st.Claims != 1 || st.Ready != 1 {
		t.Errorf("after another org's create: %+v", st)
	}

	// A runner restart: the claimed sandbox is re-adopted with the caller's spec; the warm
	// Pod nobody claimed is deleted.
	s.Close()
	s2 := newStack(t, c, runnerID, dataDir)
	defer s2.Close()
	got, err := s2.Runner.Get(id)
	if err != nil {
		t.Fatalf("the claimed sandbox is lost after a restart: %v", err)
	}
	if got.State != runner.StateRunning || got.Spec.Env["GREETING"] != "hi there" {
		t.Errorf("re-adopted: %s env %v", got.State, got.Spec.Env)
	}
	if out := string(exec(t, s2.Runner, id, "cat", "/tmp/env-of-main").Stdout); out != "hi there\n" {
		t.Errorf("after re-adoption: %q", out)
	}
	end := time.Now().Add(time.Minute)
	for {
		list, err := pods.List(ctx, warmSel)
		if err == nil && len(list.Items) == 0 {
			break
		}
		if time.Now().After(end) {
			var names []string
			for _, p := range list.Items {
				names = append(names, p.Name)
			}
			t.Fatalf("warm pods left after the restart: %s", strings.Join(names, ", "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
