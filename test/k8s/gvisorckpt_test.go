package k8s

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// tickScript keeps its state only in the shell's memory: a random value drawn once and a
// counter, printed every 100 ms. A Pod that starts afresh draws another value and counts
// from 1; one restored from a checkpoint goes on with the same value and count.
const tickScript = `s=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); n=0; while :; do n=$((n+1)); echo "tick $n $s"; sleep 0.1; done`

var tickLine = regexp.MustCompile(`^tick ([0-9]+) ([0-9a-f]{16})$`)

// TestGVisorCheckpointRestore: a `gvisor` Pod is checkpointed through its shim's
// hibernate server (internal/nodeagent/hibernate; up.sh: enable_hibernate_server), its
// sandbox ending (leave_running=false); the Pod is deleted; a new Pod with the same spec and
// the annotation dev.sandboxd.restore.checkpoint-id on the same node is restored from the
// image by the patched shim (scripts/runsc-shim/gvisor-0003) and goes on with the state
// the first one held only in memory. Pods naming a checkpoint id that is not one (a path),
// that does not exist, or whose image directory is empty (a failed checkpoint's: no
// hibernate.CompleteMarker) fail to start, with the shim's reason in their events, and are
// deleted within a bound.
func TestGVisorCheckpointRestore(t *testing.T) {
	c := needCluster(t)
	if os.Geteuid() != 0 {
		msg := "needs root: the shim's hibernate socket and the checkpoint root are root's"
		if os.Getenv("SANDBOXD_K8S_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dataDir := env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s")
	hibDir := env("SANDBOXD_K8S_HIBERNATE_DIR", filepath.Join(dataDir, "hib"))
	ckptRoot := env("SANDBOXD_K8S_CHECKPOINT_ROOT", filepath.Join(dataDir, "checkpoints"))
	rc, err := stack.RESTConfig(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := k8sclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag := randomID("")
	pods := client.CoreV1().Pods(c.namespace)
	var made []string
	t.Cleanup(func() {
		for _, n := range made {
			_ = pods.Delete(context.Background(), n, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	})
	create := func(name, restore, node string) *corev1.Pod {
		t.Helper()
		p := tickPod(name, tag, restore, node)
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		made = append(made, name)
		return p
	}

	// The invalid restores first (they fail while the rest runs): a path, an ID with no
	// image, and an image directory a checkpoint never completed (empty, no marker).
	create("gvckpt-bad-"+tag, "../../etc", "")
	create("gvckpt-none-"+tag, "none-"+tag, "")
	emptyImage, err := hibernate.CreateImageDir(ckptRoot, "e2e-empty-"+tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(emptyImage) })
	create("gvckpt-empty-"+tag, "e2e-empty-"+tag, "")
	// A marked image that is garbage passes the shim's checks and fails in `runsc restore`:
	// the patched shim kills, force-deletes and stops that sandbox, so the Pod can go.
	corruptImage, err := hibernate.CreateImageDir(ckptRoot, "e2e-corrupt-"+tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(corruptImage) })
	if err := os.WriteFile(filepath.Join(corruptImage, "checkpoint.img"), []byte("not a checkpoint"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := hibernate.MarkComplete(corruptImage); err != nil {
		t.Fatal(err)
	}
	create("gvckpt-corrupt-"+tag, "e2e-corrupt-"+tag, "")

	// 1. The Pod runs and holds its state.
	a := "gvckpt-a-" + tag
	create(a, "", "")
	podA := waitPod(t, ctx, pods, a, func(p *corev1.Pod) bool { return containerRunning(p) })
	before := waitTicks(t, ctx, pods, a, "", 5)
	secret := before[len(before)-1].secret
	t.Logf("pod %s on %s: tick %d, value %s", a, podA.Spec.NodeName, before[len(before)-1].n, secret)

	// 2. Checkpoint its sandbox through the shim's hibernate server.
	sandboxID := podSandboxID(t, dataDir, podA)
	sock, err := hibernate.SocketPath(hibDir, sandboxID)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := hibernate.Dial(ctx, sock)
	if err != nil {
		t.Fatalf("the shim's hibernate server (enable_hibernate_server in up.sh's runsc-shim.toml): %v", err)
	}
	defer hc.Close()
	if v, err := hc.Version(ctx); err != nil {
		t.Fatalf("hibernate Version: %v", err)
	} else {
		t.Logf("hibernate server of sandbox %s: version %q", sandboxID[:12], v)
	}
	// A checkpoint that leaves the sandbox running (a fork's), then Wait{CHECKPOINT}.
	forkID := "e2e-fork-" + tag
	forkImage, err := hibernate.CreateImageDir(ckptRoot, forkID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(forkImage) })
	// Wait{CHECKPOINT} waits for the sandbox's next checkpoint (runsc wait --checkpoint), on
	// a connection of its own. When the wait reached the sandbox is unknown (the shim's
	// `runsc wait` registers "checkpoint count + 1" when it gets there): a checkpoint that
	// finished before is missed, so when the wait has not returned 5 s after a checkpoint,
	// another leave-running checkpoint (into a scratch dir) is taken, a few times.
	wc, err := hibernate.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	type waited struct {
		st  int32
		err error
		at  time.Time
	}
	waitDone := make(chan waited, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		st, err := wc.WaitCheckpoint(wctx, sandboxID)
		waitDone <- waited{st, err, time.Now()}
	}()
	t0 := time.Now()
	if err := hc.Checkpoint(ctx, hibernate.CheckpointRequest{ContainerID: sandboxID, ImagePath: forkImage, LeaveRunning: true}); err != nil {
		t.Fatalf("checkpoint (leave_running): %v", err)
	}
	tFork := time.Since(t0)
	if err := hibernate.MarkComplete(forkImage); err != nil {
		t.Fatal(err)
	}
	var w waited
	tLast := t0
	for extra := 0; ; extra++ {
		select {
		case w = <-waitDone:
		case <-time.After(5 * time.Second):
			if extra == 3 {
				t.Fatalf("Wait{CHECKPOINT} did not return after %d checkpoints", extra+1)
			}
			scratch, err := hibernate.CreateImageDir(ckptRoot, fmt.Sprintf("e2e-scratch-%s-%d", tag, extra))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(scratch) })
			t.Logf("Wait{CHECKPOINT} not back 5 s after checkpoint %d: another", extra+1)
			tLast = time.Now()
			if err := hc.Checkpoint(ctx, hibernate.CheckpointRequest{ContainerID: sandboxID, ImagePath: scratch, LeaveRunning: true}); err != nil {
				t.Fatalf("checkpoint (leave_running, scratch): %v", err)
			}
			continue
		}
		break
	}
	if w.err != nil || w.st != 0 {
		t.Fatalf("Wait{CHECKPOINT}: exit %d, %v", w.st, w.err)
	}
	t.Logf("Wait{CHECKPOINT} returned %s after the last checkpoint began", w.at.Sub(tLast).Round(time.Millisecond))
	forkTicks := waitTicks(t, ctx, pods, a, "", 1)
	forkN := forkTicks[len(forkTicks)-1].n
	// It runs on.
	waitTicks(t, ctx, pods, a, secret, forkN+3)
	t.Logf("checkpoint (leave_running=true): %s; pod %s runs on", tFork.Round(time.Millisecond), a)

	// The pause's checkpoint: the sandbox ends with it.
	ckptID := "e2e-" + tag
	image, err := hibernate.CreateImageDir(ckptRoot, ckptID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(image) })
	t0 = time.Now()
	if err := hc.Checkpoint(ctx, hibernate.CheckpointRequest{ContainerID: sandboxID, ImagePath: image}); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	tCkpt := time.Since(t0)
	if err := hibernate.MarkComplete(image); err != nil {
		t.Fatal(err)
	}
	size, files := dirSize(t, image)
	t.Logf("checkpoint (leave_running=false): %s; image %s: %d files, %d KiB", tCkpt.Round(time.Millisecond), image, files, size>>10)
	if files <= 1 {
		t.Fatal("the checkpoint wrote no image")
	}

	// The sandbox ended with the checkpoint: the Pod's container is no longer running.
	waitPod(t, ctx, pods, a, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	})
	last := waitTicks(t, ctx, pods, a, "", 1)
	lastN := last[len(last)-1].n
	if err := pods.Delete(ctx, a, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, ctx, pods, a)
	t.Logf("pod %s: last tick %d before the checkpoint; deleted", a, lastN)

	// 3. A new Pod on the same node restores it.
	b := "gvckpt-b-" + tag
	t1 := time.Now()
	create(b, ckptID, podA.Spec.NodeName)
	waitPod(t, ctx, pods, b, func(p *corev1.Pod) bool { return containerRunning(p) })
	tRunning := time.Since(t1)
	after := waitTicks(t, ctx, pods, b, secret, lastN+1)
	tTick := time.Since(t1)
	t.Logf("restore: Pod created -> container running %s, -> a tick after %d %s (ticks %d..%d, value %s)",
		tRunning.Round(time.Millisecond), lastN, tTick.Round(time.Millisecond), after[0].n, after[len(after)-1].n, after[len(after)-1].secret)
	for _, tk := range after {
		if tk.secret != secret {
			t.Fatalf("restored Pod printed %q: value %s, not the checkpointed %s (started afresh?)", tk.line, tk.secret, secret)
		}
	}
	if after[0].n <= lastN-50 { // the first line a restore prints goes on from the checkpoint
		t.Errorf("restored Pod starts at tick %d, checkpoint at %d", after[0].n, lastN)
	}
	fmt.Fprintf(os.Stderr, "gVisor on Kubernetes: checkpoint %s (image %d KiB), restore to running %s, to its first tick %s\n",
		tCkpt.Round(time.Millisecond), size>>10, tRunning.Round(time.Millisecond), tTick.Round(time.Millisecond))

	// A fork: another new Pod restores the first checkpoint (taken while the sandbox ran on)
	// and goes on from there, with the same value.
	f := "gvckpt-f-" + tag
	t2 := time.Now()
	create(f, forkID, podA.Spec.NodeName)
	forked := waitTicks(t, ctx, pods, f, secret, forkN+1)
	t.Logf("fork: Pod created -> first tick after %d %s (first tick %d)", forkN, time.Since(t2).Round(time.Millisecond), forked[0].n)
	for _, tk := range forked {
		if tk.secret != secret {
			t.Fatalf("forked Pod printed %q: not the checkpointed value %s", tk.line, secret)
		}
	}
	if forked[0].n > lastN {
		t.Errorf("forked Pod starts at tick %d, after the pause's checkpoint (%d), not from the fork's (%d)", forked[0].n, lastN, forkN)
	}

	// 4. The invalid restores never ran, say why within 30 s of the Pod's creation, and
	// are deleted (gracefully: the kubelet stops the sandbox first) within 30 s. Stock, a
	// sandbox whose restore failed stays "created" and never exits: containerd's cleanup
	// of the failed start waits out its minute, and the delete hangs.
	for name, want := range map[string]string{
		"gvckpt-bad-" + tag:     "invalid checkpoint id",
		"gvckpt-none-" + tag:    "no such file or directory",
		"gvckpt-empty-" + tag:   "incomplete image",
		"gvckpt-corrupt-" + tag: "restore failed",
	} {
		ev := waitEvent(t, ctx, client, c.namespace, name, want)
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		at := ev.FirstTimestamp.Time
		if at.IsZero() {
			at = ev.EventTime.Time
		}
		after := at.Sub(p.CreationTimestamp.Time)
		t.Logf("pod %s: %s after its creation: %s: %s", name, after, ev.Reason, ev.Message)
		if after > 30*time.Second {
			t.Errorf("pod %s: its start failed %s after its creation (a failed restore's cleanup hung?)", name, after)
		}
		if p.Status.Phase == corev1.PodRunning || containerRunning(p) {
			t.Errorf("pod %s with a bad restore annotation runs", name)
		}
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(1))}); err != nil {
			t.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		t0 := time.Now()
		waitPodGone(t, dctx, pods, name)
		dcancel()
		t.Logf("pod %s deleted in %s", name, time.Since(t0).Round(time.Millisecond))
	}
}

func tickPod(name, tag, restore, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"sandboxd-test": "gvckpt-" + tag}},
		Spec: corev1.PodSpec{
			RuntimeClassName:              ptrTo("gvisor"),
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptrTo(false),
			EnableServiceLinks:            ptrTo(false),
			TerminationGracePeriodSeconds: ptrTo(int64(0)),
			NodeName:                      node,
			Containers: []corev1.Container{{
				Name: "tick", Image: busybox, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", tickScript},
			}},
		},
	}
	if restore != "" {
		p.Annotations = map[string]string{hibernate.RestoreAnnotation: restore}
	}
	return p
}

func containerRunning(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil {
			return true
		}
	}
	return false
}

func waitPod(t *testing.T, ctx context.Context, pods corev1client.PodInterface, name string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	for {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && ok(p) {
			return p
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s: %v (last: %v)", name, ctx.Err(), err)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func waitPodGone(t *testing.T, ctx context.Context, pods corev1client.PodInterface, name string) {
	t.Helper()
	for {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s still there: %v", name, ctx.Err())
		}
		time.Sleep(150 * time.Millisecond)
	}
}

type tick struct {
	line   string
	n      int
	secret string
}

// waitTicks waits until Pod name's log has a tick numbered at least min (of value secret,
// unless ""), and returns the log's ticks.
func waitTicks(t *testing.T, ctx context.Context, pods corev1client.PodInterface, name, secret string, min int) []tick {
	t.Helper()
	var last string
	for {
		raw, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err == nil {
			var ticks []tick
			sc := bufio.NewScanner(strings.NewReader(string(raw)))
			for sc.Scan() {
				if m := tickLine.FindStringSubmatch(sc.Text()); m != nil {
					n, _ := strconv.Atoi(m[1])
					ticks = append(ticks, tick{line: sc.Text(), n: n, secret: m[2]})
				}
			}
			for _, tk := range ticks {
				if secret != "" && tk.secret != secret {
					t.Fatalf("pod %s printed %q: value %s, not the checkpointed %s (it started afresh)", name, tk.line, tk.secret, secret)
				}
			}
			if len(ticks) > 0 {
				l := ticks[len(ticks)-1]
				last = l.line
				if l.n >= min && (secret == "" || l.secret == secret) {
					return ticks
				}
			}
		} else {
			last = err.Error()
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s: no tick >= %d (value %q) in its log: %v (last: %q)", name, min, secret, ctx.Err(), last)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// podSandboxID is the CRI sandbox ID of p: the containerd task of p's container carries
// it in its OCI spec (annotation io.kubernetes.cri.sandbox-id), in containerd's state dir.
func podSandboxID(t *testing.T, dataDir string, p *corev1.Pod) string {
	t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s: no container status", p.Name)
	}
	cid, ok := strings.CutPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok || hibernate.ValidContainerID(cid) != nil {
		t.Fatalf("pod %s: container ID %q", p.Name, p.Status.ContainerStatuses[0].ContainerID)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", cid, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	id := spec.Annotations["io.kubernetes.cri.sandbox-id"]
	if err := hibernate.ValidContainerID(id); err != nil {
		t.Fatalf("pod %s: sandbox id: %v", p.Name, err)
	}
	return id
}

func dirSize(t *testing.T, dir string) (int64, int) {
	t.Helper()
	var size int64
	var n int
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		size += fi.Size()
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return size, n
}

// waitEvent waits for an event of Pod name whose message contains want, and returns it.
func waitEvent(t *testing.T, ctx context.Context, client k8sclient.Interface, ns, name, want string) corev1.Event {
	t.Helper()
	var seen []string
	for {
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err == nil {
			seen = seen[:0]
			for _, e := range evs.Items {
				if strings.Contains(e.Message, want) {
					return e
				}
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s: no event saying %q: %v (events: %q)", name, want, ctx.Err(), seen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
