package k8s

import (
	"bufio"
	"context"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/stack"
)

// buildSandboxd builds the sandboxd binary into the test's temporary directory (the Go
// build cache makes this a link step after the first time).
func buildSandboxd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandboxd")
	if out, err := osexec.Command("go", "build", "-o", bin, "../../cmd/sandboxd").CombinedOutput(); err != nil {
		t.Fatalf("build sandboxd: %v\n%s", err, out)
	}
	return bin
}

// runnerProc is a `sandboxd runner --backend kubernetes` process (env added to this
// process's); listening is closed once it prints that it serves.
type runnerProc struct {
	cmd       *osexec.Cmd
	listening chan struct{}
	output    strings.Builder
	mu        sync.Mutex
}

func startRunner(t *testing.T, bin string, env []string, args ...string) *runnerProc {
	t.Helper()
	p := &runnerProc{cmd: osexec.Command(bin, append([]string{"runner"}, args...)...), listening: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			p.mu.Lock()
			p.output.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if strings.Contains(sc.Text(), " listening on ") {
				once.Do(func() { close(p.listening) })
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); pw.Close() }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

func (p *runnerProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// TestLeaderLease: two runner processes with the same configuration (same runner ID, same
// Lease): only one serves; killed without releasing its lease, the other takes over
// within the lease duration.
func TestLeaderLease(t *testing.T) {
	c := needCluster(t)
	bin := buildSandboxd(t)
	const leaseDuration = 3 * time.Second
	runnerID, lease := randomID("lease-"), randomID("sandboxd-runner-")
	args := func(name string) []string {
		dir := t.TempDir()
		return []string{"--backend", "kubernetes", "--kubeconfig", c.kubeconfig, "--namespace", c.namespace,
			"--agent-image", c.agentImage, "--image-pull-policy", "Never", "--runner-id", runnerID,
			"--listen", "127.0.0.1:0", "--data-dir", dir, "--pki-dir", filepath.Join(dir, "pki"),
			"--leader-elect", "--leader-elect-lease", lease, "--leader-elect-identity", name,
			"--leader-elect-lease-duration", leaseDuration.String()}
	}
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := k8s.NewForConfigOrDie(rc)
	t.Cleanup(func() {
		_ = client.CoordinationV1().Leases(c.namespace).Delete(context.Background(), lease, metav1.DeleteOptions{})
	})

	a := startRunner(t, bin, nil, args("a")...)
	select {
	case <-a.listening:
	case <-time.After(time.Minute):
		t.Fatalf("the first runner does not serve:\n%s", a.log())
	}
	b := startRunner(t, bin, nil, args("b")...)
	// b waits for the lease however long a holds it (a renews it): two lease durations
	// show that it is renewed.
	select {
	case <-b.listening:
		t.Fatalf("two runners serve at once:\n%s", b.log())
	case <-time.After(2 * leaseDuration):
	}
	if !strings.Contains(b.log(), "waiting for the runner lease") {
		t.Errorf("the second runner does not wait for the lease:\n%s", b.log())
	}
	l, err := client.CoordinationV1().Leases(c.namespace).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "a" {
		t.Fatalf("lease %+v (%v), want held by a", l, err)
	}

	// Killed: no release; b takes over once the lease expires.
	killed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.listening:
		took := time.Since(killed)
		t.Logf("takeover after %s (lease duration %s)", took.Round(time.Millisecond), leaseDuration)
		if took > leaseDuration+3*time.Second {
			t.Errorf("takeover took %s, lease duration %s", took, leaseDuration)
		}
	case <-time.After(leaseDuration + 30*time.Second):
		t.Fatalf("the second runner did not take over:\n%s", b.log())
	}
	if l, err := client.CoordinationV1().Leases(c.namespace).Get(context.Background(), lease, metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity != "b" {
		t.Errorf("lease holder %v (%v), want b", l.Spec.HolderIdentity, err)
	}

	// SIGTERM releases the lease on the way out.
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := client.CoordinationV1().Leases(c.namespace).Get(context.Background(), lease, metav1.GetOptions{})
		if err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease not released after SIGTERM: %+v %v\n%s", l.Spec, err, b.log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
