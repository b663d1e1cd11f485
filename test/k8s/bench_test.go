package k8s

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
)

// BenchmarkTimeToFirstCommand: create → the first exec (`true`) has answered, one
// sandbox at a time, on the Kubernetes backend and on the local backend (runc on this
// host) in the same run, with warm image caches: p50 and p99 of each and their ratio.
// Then ours from the Kubernetes backend's warm pool (ttfcWarm, the k8s-warm line), and
// the Kubernetes peer, kubernetes-sigs/agent-sandbox (agentSandboxPeer): claim → first
// command without and with its warm pool, beside ours (its warm line beside k8s-warm), as
// ratios.
// $SANDBOXD_BENCH_N sandboxes per backend (default 20). Run it with `make bench-k8s`
// (brings the cluster up and down) or, on a cluster that is up:
//
//	go test -run '^$' -bench TimeToFirstCommand -benchtime 1x ./test/k8s/
func BenchmarkTimeToFirstCommand(b *testing.B) {
	c := needCluster(b)
	n := 20
	if v, err := strconv.Atoi(os.Getenv("SANDBOXD_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	steps := newStepLog()
	kst := newStack(b, c, randomID("bench-"), b.TempDir(), func(cfg *kubernetes.Config) { cfg.StepHook = steps.hook })
	b.Cleanup(kst.Close)
	env, err := stacktest.Setup("k8sb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.Close)
	lst, err := env.Stack(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		lst.Close()
		_ = lst.Network.Cleanup()
	})
	for range b.N {
		k8s := ttfc(b, kst.Runner, busybox, n, steps)
		local := ttfc(b, lst.Runner, env.Busybox(), n, nil)
		kp50, kp99 := pct(k8s, 0.50), pct(k8s, 0.99)
		lp50, lp99 := pct(local, 0.50), pct(local, 0.99)
		b.ReportMetric(ms(kp50), "k8s-p50-ms")
		b.ReportMetric(ms(kp99), "k8s-p99-ms")
		b.ReportMetric(ms(lp50), "local-p50-ms")
		b.ReportMetric(ms(lp99), "local-p99-ms")
		fmt.Printf("time to first command over %d sandboxes each: kubernetes p50 %.0f ms p99 %.0f ms; local p50 %.0f ms p99 %.0f ms; ratio p50 %.1fx p99 %.1fx\n",
			n, ms(kp50), ms(kp99), ms(lp50), ms(lp99), ms(kp50)/ms(lp50), ms(kp99)/ms(lp99))
		fmt.Printf("kubernetes create steps over %d sandboxes, p50 of the time since the create call (ms; seen by the runner; n = creates that saw the step): %s\n",
			n, steps.summary())
		warm := ttfcWarm(b, kst, n)
		wp50, wp99 := pct(warm, 0.50), pct(warm, 0.99)
		b.ReportMetric(ms(wp50), "k8s-warm-p50-ms")
		b.ReportMetric(ms(wp99), "k8s-warm-p99-ms")
		fmt.Printf("k8s-warm: time to first command from a warm pool of 1 (claim of a warm Pod) over %d sandboxes: p50 %.0f ms p99 %.0f ms\n", n, ms(wp50), ms(wp99))
		agentSandboxPeer(b, c, n, k8s, warm)
	}
}

// agentSandboxPeer measures the Kubernetes peer (agentsandbox_test.go) on the same
// cluster, claim → first command, from a warm pool of 0 (cold: the claim creates its
// Sandbox) and of 1 (warm), n claims each, and prints each beside ours (create → first
// command on the Kubernetes backend, no warm pool) as the ratio ours / theirs. A peer
// that is not built is a printed skip; one that is built but fails to install or answer
// fails the benchmark under SANDBOXD_K8S_REQUIRED=1 (CI) and is a printed skip otherwise.
func agentSandboxPeer(b *testing.B, c cluster, n int, ours, oursWarm []time.Duration) {
	b.Helper()
	skip := func(err error) {
		if !errors.Is(err, errPeerNotBuilt) && os.Getenv("SANDBOXD_K8S_REQUIRED") == "1" {
			b.Fatalf("agent-sandbox %s: %v", agentSandboxVersion, err)
		}
		fmt.Printf("agent-sandbox %s: not measured: %v\n", agentSandboxVersion, err)
	}
	p, err := startAgentSandbox(b, c)
	if err != nil {
		skip(err)
		return
	}
	op50, op99 := pct(ours, 0.50), pct(ours, 0.99)
	for _, kind := range []string{"cold", "warm"} {
		ds, err := ttfcAgentSandbox(p, kind, n)
		if err != nil {
			p.failed = true
			skip(err)
			return
		}
		p50, p99 := pct(ds, 0.50), pct(ds, 0.99)
		b.ReportMetric(ms(p50), "agent-sandbox-"+kind+"-p50-ms")
		b.ReportMetric(ms(p99), "agent-sandbox-"+kind+"-p99-ms")
		fmt.Printf("agent-sandbox %s claim → first command (exec via the API server), warm pool of %d, over %d claims: p50 %.0f ms p99 %.0f ms; sandboxd kubernetes p50 %.0f ms p99 %.0f ms; ratio sandboxd/agent-sandbox p50 %.2fx p99 %.2fx\n",
			agentSandboxVersion, poolReplicas[kind], n, ms(p50), ms(p99), ms(op50), ms(op99), ms(op50)/ms(p50), ms(op99)/ms(p99))
		if kind == "warm" && len(oursWarm) > 0 {
			wp50, wp99 := pct(oursWarm, 0.50), pct(oursWarm, 0.99)
			b.ReportMetric(ms(wp50)/ms(p50), "k8s-warm-over-agent-sandbox-warm-p50")
			fmt.Printf("k8s-warm vs agent-sandbox %s warm (pool of 1 each): sandboxd p50 %.0f ms p99 %.0f ms; agent-sandbox p50 %.0f ms p99 %.0f ms; ratio sandboxd/agent-sandbox p50 %.2fx p99 %.2fx\n",
				agentSandboxVersion, ms(wp50), ms(wp99), ms(p50), ms(p99), ms(wp50)/ms(p50), ms(wp99)/ms(p99))
		}
	}
}

// jitterSleep sleeps a random 0-1 s.
func jitterSleep() {
	jitter, _ := rand.Int(rand.Reader, big.NewInt(1000))
	time.Sleep(time.Duration(jitter.Int64()) * time.Millisecond)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the q-quantile of ds (nearest rank; with 20 samples p99 is the maximum).
func pct(ds []time.Duration, q float64) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(q*float64(len(ds)) + 0.999999) // ceil
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// benchSteps are the create steps the Kubernetes backend reports (Config.StepHook), in
// the order they happen on a create; "first-exec" is the bench's own.
var benchSteps = []string{kubernetes.StepCreated, kubernetes.StepScheduled, kubernetes.StepHello, kubernetes.StepPinging, kubernetes.StepReady, kubernetes.StepRunning, "first-exec"}

// stepLog gathers the Kubernetes backend's create steps per sandbox (its StepHook) and,
// per measured create, each step's time since the create call.
type stepLog struct {
	mu    sync.Mutex
	at    map[string]map[string]time.Time // by sandbox ID, by step
	since map[string][]time.Duration      // by step, one per measured create that saw it
}

func newStepLog() *stepLog {
	return &stepLog{at: map[string]map[string]time.Time{}, since: map[string][]time.Duration{}}
}

func (l *stepLog) hook(id, step string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at[id] == nil {
		l.at[id] = map[string]time.Time{}
	}
	if _, ok := l.at[id][step]; !ok {
		l.at[id][step] = at
	}
}

// wait waits (bounded) until sandbox id has reported step.
func (l *stepLog) wait(id, step string, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		_, ok := l.at[id][step]
		l.mu.Unlock()
		if ok {
			return
		}
	}
}

// order returns when sandbox id reached steps a and b, ok when it reached both.
func (l *stepLog) order(id, a, b string) (time.Time, time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ta, oka := l.at[id][a]
	tb, okb := l.at[id][b]
	return ta, tb, oka && okb
}

// take records sandbox id's steps relative to t0, with the first exec answered at exec.
func (l *stepLog) take(id string, t0, exec time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for step, at := range l.at[id] {
		l.since[step] = append(l.since[step], at.Sub(t0))
	}
	l.since["first-exec"] = append(l.since["first-exec"], exec.Sub(t0))
	delete(l.at, id)
}

// summary is "step p50 (n)" for each step seen, in create order.
func (l *stepLog) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for _, step := range benchSteps {
		if ds := l.since[step]; len(ds) > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f (n=%d)", step, ms(pct(ds, 0.50)), len(ds)))
		}
	}
	return strings.Join(parts, ", ")
}

// ttfc creates n sandboxes one after the other (after one unmeasured warm-up) and
// returns create → first exec answered for each. steps (nil: none) records the
// Kubernetes backend's create steps of the measured creates.
func ttfc(b *testing.B, r *runner.Runner, image string, n int, steps *stepLog) []time.Duration {
	b.Helper()
	var out []time.Duration
	for i := -1; i < n; i++ {
		// The kubelet relists every second: a random start samples where in that period
		// a create lands (back-to-back creates would all land at one phase). The same for
		// both backends.
		jitterSleep()
		t0 := time.Now()
		sb, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: image, Command: "sleep", Args: []string{"3600"}}}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		c, err := r.Agent(ctx, sb.ID, "") // waits for RUNNING
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
		cancel()
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatalf("first exec: %v", err)
		}
		execAt := time.Now()
		if i >= 0 {
			out = append(out, execAt.Sub(t0))
		}
		if steps != nil {
			// The kubelet's running report may come after the first exec (its relist).
			steps.wait(sb.ID, kubernetes.StepRunning, 3*time.Second)
			if i >= 0 {
				steps.take(sb.ID, t0, execAt)
			}
		}
		if _, err := r.Delete(sb.ID, 0); err != nil {
			b.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		_, _ = r.WaitTerminal(ctx, sb.ID)
		cancel()
	}
	return out
}

// ttfcWarm is ttfc from the Kubernetes backend's warm pool: the same spec as a warm
// target of size 1; before each sample the pool has refilled (not measured), then
// create → first exec answered, as ttfc.
func ttfcWarm(b *testing.B, kst *stack.KubernetesStack, n int) []time.Duration {
	b.Helper()
	r := kst.Runner
	spec := runtime.Spec{Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}}}
	if err := r.SetWarmPools(context.Background(), []runtime.WarmTarget{{Key: "bench/busybox", Spec: spec, Size: 1}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.SetWarmPools(context.Background(), nil) }()
	claims := kst.Backend.WarmStats().Claims
	var out []time.Duration
	for i := -1; i < n; i++ {
		waitWarmReady(b, kst, 1)
		jitterSleep()
		t0 := time.Now()
		sb, err := r.Create(context.Background(), runner.CreateRequest{Spec: spec})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		c, err := r.Agent(ctx, sb.ID, "")
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
		cancel()
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatalf("first exec: %v", err)
		}
		if i >= 0 {
			out = append(out, time.Since(t0))
		}
		if _, err := r.Delete(sb.ID, 0); err != nil {
			b.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		_, _ = r.WaitTerminal(ctx, sb.ID)
		cancel()
	}
	if got := kst.Backend.WarmStats().Claims - claims; got != n+1 {
		b.Fatalf("k8s-warm: %d of %d creates claimed a warm pod", got, n+1)
	}
	return out
}
