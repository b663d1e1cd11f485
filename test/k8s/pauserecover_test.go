package k8s

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// TestK8sPauseRecover (issue 21, point 6): a `gvisor` sandbox paused with state in memory
// stays PAUSED and resumable across a runner restart. The runner is stopped (its Runner
// and Backend closed) while the sandbox is paused; a new runner of the same runner ID on
// the same namespace and data dir finds it PAUSED (released, as it was paused: the
// runner's pause record kept), its checkpoint image still on the node; its Resume
// continues the same processes (the value and counter in the shell's memory, a file in
// /tmp). Paused again and the runner restarted again, Delete of the sandbox the new
// runner took over leaves neither Secret nor checkpoint image.
func TestK8sPauseRecover(t *testing.T) {
	pe := newPauseEnv(t)
	c := pe.c
	dataDir := t.TempDir()
	var cur *stack.KubernetesStack
	restart := func() *runner.Runner {
		if cur != nil {
			cur.Close()
		}
		cur = pe.stack(t, dataDir)
		return cur.Runner
	}
	t.Cleanup(func() {
		cur.Close()
		deleteRunnerObjects(cur.Client, c.namespace, pe.runnerID)
	})
	r := restart()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container:    runtime.Container{Image: busybox, Command: "sh", Args: []string{"-c", pauseTickScript}},
		RuntimeClass: "gvisor",
		Meta:         map[string]string{runtime.MetaOrg: "org-1"},
		Network:      &runtime.Network{Egress: []runtime.EgressRule{{CIDR: "203.0.113.0/24"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if sb = waitState(t, r, id, 2*time.Minute, running); sb.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s), want RUNNING", sb.State, sb.Reason, sb.Message)
	}
	if res := exec(t, r, id, "sh", "-c", "echo kept > /tmp/f"); res.ExitCode != 0 {
		t.Fatalf("write /tmp/f: exit %d %q", res.ExitCode, res.Stderr)
	}
	val, n0 := readTick(t, r, id)
	psb, err := r.Pause(ctx, id, runner.PauseOptions{AutoResume: false})
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	secrets := cur.Client.CoreV1().Secrets(c.namespace)
	sec, err := secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(pe.ckptRoot, sec.Annotations["sandboxd.io/paused-checkpoint"])
	if sec.Annotations["sandboxd.io/paused-pod"] == "" {
		t.Errorf("paused Secret's annotations %v: no record of the paused Pod", sec.Annotations)
	}

	// The runner stops while the sandbox is paused; another takes over.
	r = restart()
	got, err := r.Get(id)
	if err != nil {
		t.Fatalf("the restarted runner does not know the paused sandbox: %v", err)
	}
	if got.State != runner.StatePaused || got.Pause == nil || !got.Pause.Released || got.Pause.AutoResume ||
		!got.Pause.PausedAt.Equal(psb.Pause.PausedAt) {
		t.Fatalf("after the restart: %s (%s: %s), pause %+v; want PAUSED as paused: %+v", got.State, got.Reason, got.Message, got.Pause, psb.Pause)
	}
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the checkpoint image after the restart: %v", err)
	}
	t0 := time.Now()
	rsb, err := r.Resume(ctx, id)
	if err != nil {
		t.Fatalf("resume after the restart: %v", err)
	}
	t.Logf("resume after the restart: %s", time.Since(t0).Round(time.Millisecond))
	if rsb.State != runner.StateRunning || rsb.IP == "" {
		t.Fatalf("after resume: %s, IP %q; want RUNNING with an address", rsb.State, rsb.IP)
	}
	if res := exec(t, r, id, "cat", "/tmp/f"); string(res.Stdout) != "kept\n" {
		t.Errorf("/tmp/f after the resume: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	val1, n1 := readTick(t, r, id)
	if val1 != val || n1 < n0 {
		t.Fatalf("after the resume the main command holds %s %d, before the pause %s %d: it did not continue", val1, n1, val, n0)
	}

	// Paused again, the runner restarted again: Delete removes Secret and image.
	if _, err := r.Pause(ctx, id, runner.PauseOptions{AutoResume: true}); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	sec, err = secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image = filepath.Join(pe.ckptRoot, sec.Annotations["sandboxd.io/paused-checkpoint"])
	r = restart()
	if got, err := r.Get(id); err != nil || got.State != runner.StatePaused || got.Pause == nil || !got.Pause.AutoResume {
		t.Fatalf("after the second restart: %+v (%v), want PAUSED, auto-resume", got.Pause, err)
	}
	if _, err := r.Delete(id, 2*time.Second); err != nil {
		t.Fatalf("delete the paused sandbox: %v", err)
	}
	if end := terminal(t, r, id); end.State != runner.StateTerminated || end.Reason != runner.ReasonDeleted {
		t.Errorf("deleted while paused: %s %s (%s), want TERMINATED Deleted", end.State, end.Reason, end.Message)
	}
	secrets = cur.Client.CoreV1().Secrets(c.namespace)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, serr := secrets.Get(ctx, "sbx-"+id, metav1.GetOptions{})
		_, ierr := os.Stat(image)
		if apierrors.IsNotFound(serr) && os.IsNotExist(ierr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after deleting the recovered paused sandbox: secret %v, image %v (want both gone)", serr, ierr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
