package k8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// podPidsCgroup finds the Pod's pids cgroup on this node (the kubelet's cgroupfs layout:
// <root>/kubepods[/<qos>]/pod<uid>, cgroup v1 or v2).
func podPidsCgroup(t *testing.T, uid string) string {
	t.Helper()
	for _, pat := range []string{
		"/sys/fs/cgroup/pids/*/kubepods/pod" + uid, "/sys/fs/cgroup/pids/*/kubepods/*/pod" + uid,
		"/sys/fs/cgroup/*/kubepods/pod" + uid, "/sys/fs/cgroup/*/kubepods/*/pod" + uid,
	} {
		if m, _ := filepath.Glob(pat); len(m) == 1 {
			if _, err := os.Stat(filepath.Join(m[0], "pids.max")); err == nil {
				return m[0]
			}
		}
	}
	t.Fatalf("no pids cgroup for pod %s on this node", uid)
	return ""
}

func readCgroup(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestForkBomb: a sandbox whose command spawns processes without end (6000 sleeps in a
// loop, more than the limit) is contained by its Pod's pids cgroup, the kubelet's
// podPidsLimit (up.sh: runtime.DefaultPidsLimit), and refused forks are counted, while
// another sandbox on the node keeps answering exec.
func TestForkBomb(t *testing.T) {
	c, s, _ := setup(t)
	ctx := context.Background()
	r := s.Runner
	calm, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}}}})
	if err != nil {
		t.Fatal(err)
	}
	// One CPU at most: the host is shared.
	bomb, err := r.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MilliCPU: 1000}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, r, calm.ID, time.Minute, running)
	waitState(t, r, bomb.ID, time.Minute, running)
	pod, err := s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+bomb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cg := podPidsCgroup(t, string(pod.UID))
	if got, want := readCgroup(t, cg, "pids.max"), strconv.Itoa(runtime.DefaultPidsLimit); got != want {
		t.Fatalf("pod pids.max %s, want %s (the kubelet's podPidsLimit)", got, want)
	}
	// The bomb runs as an exec (busybox sh exits at its first refused fork; as the main
	// command the agent would restart it until the restart limit ends the sandbox); its
	// sleeps outlive it.
	start := time.Now()
	bombDone := make(chan struct{})
	go func() {
		defer close(bombDone)
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		ac, err := r.Agent(ectx, bomb.ID, "")
		if err != nil {
			t.Errorf("agent of the bomb: %v", err)
			return
		}
		res, err := ac.Exec(ectx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c",
			"i=0; while [ $i -lt 6000 ]; do sleep 600 & i=$((i+1)); done"}}))
		if err == nil {
			t.Logf("the bomb's shell ended: exit %d, stderr %q", res.Msg.ExitCode, res.Msg.Stderr)
		}
	}()
	// Refused forks: pids.events' "max" of the Pod's cgroup and those below it (cgroup v1
	// counts them where the fork was tried).
	refused := func() int {
		n := 0
		_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "pids.events" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "max "); ok {
					k, _ := strconv.Atoi(v)
					n += k
				}
			}
			return nil
		})
		return n
	}
	for refused() == 0 {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("no fork refused after %s: pids.current %s", time.Since(start), readCgroup(t, cg, "pids.current"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	cur, _ := strconv.Atoi(readCgroup(t, cg, "pids.current"))
	t.Logf("bomb contained after %s: pids.current %d of %d, %d forks refused so far", time.Since(start).Round(time.Millisecond), cur, runtime.DefaultPidsLimit, refused())
	if cur > runtime.DefaultPidsLimit || cur < runtime.DefaultPidsLimit-64 {
		t.Errorf("pids.current %d, want at (or just under) the limit %d", cur, runtime.DefaultPidsLimit)
	}
	for i := range 3 {
		t0 := time.Now()
		res := exec(t, r, calm.ID, "echo", fmt.Sprint("alive ", i))
		if got := string(res.Stdout); got != fmt.Sprintf("alive %d\n", i) {
			t.Errorf("the other sandbox: %q", got)
		}
		t.Logf("the other sandbox answered exec in %s", time.Since(t0).Round(time.Millisecond))
	}
	if _, err := r.Delete(bomb.ID, 0); err != nil {
		t.Fatal(err)
	}
	terminal(t, r, bomb.ID)
	<-bombDone
}
