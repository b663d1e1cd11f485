package multicluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/testbed"
)

// Churn settings: at least minOps operations, by this many workers.
const (
	minOps       = 240
	churnWorkers = 4
	// retryFor bounds how long one operation is retried across faults.
	retryFor = 90 * time.Second
)

// churn is the shared bookkeeping of the fault test.
type churn struct {
	b       *testbed.Bed
	clients []sandboxv1connect.SandboxServiceClient

	creates, execs, deletes, retries atomic.Int64
	interrupted                      atomic.Int64 // acknowledged, then FAILED by a runner crash

	mu      sync.Mutex
	acked   map[string]string // sandbox ID → runner, of every acknowledged create
	deleted map[string]bool
	errs    []string // operations that failed for good
}

func (c *churn) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// transient reports whether err is what a fault causes for a while: a gateway or runner
// down, a runner full while another is away, a call cut off.
func transient(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeResourceExhausted, connect.CodeDeadlineExceeded,
		connect.CodeUnknown, connect.CodeInternal, connect.CodeCanceled, connect.CodeAborted:
		return true
	}
	return false
}

// call runs op against a random gateway, moving to the other one on each transient
// failure, for up to retryFor.
func (c *churn) call(ctx context.Context, what string, op func(ctx context.Context, g sandboxv1connect.SandboxServiceClient) error) error {
	deadline := time.Now().Add(retryFor)
	g := rand.IntN(len(c.clients))
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := op(actx, c.clients[g])
		cancel()
		if err == nil || !transient(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		c.retries.Add(1)
		g = (g + 1) % len(c.clients)
		time.Sleep(time.Duration(100+rand.IntN(200)*min(attempt, 5)) * time.Millisecond)
		_ = what
	}
}

// cycle is one create, exec and delete.
func (c *churn) cycle(ctx context.Context, worker, n int) {
	var sb *sandboxv1.Sandbox
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox",
		Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
		Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "64Mi"}}}}
	requestID := fmt.Sprintf("churn-%d-%d", worker, n)
	err := c.call(ctx, "create", func(ctx context.Context, g sandboxv1connect.SandboxServiceClient) error {
		res, err := g.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{RequestId: requestID, Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
		if err == nil {
			sb = res.Msg
		}
		return err
	})
	c.creates.Add(1)
	if err != nil {
		c.fail("create %s: %v", requestID, err)
		return
	}
	id := sb.GetSandboxId()
	c.mu.Lock()
	c.acked[id] = sb.GetStatus().GetRunnerId()
	c.mu.Unlock()

	err = c.call(ctx, "exec", func(ctx context.Context, g sandboxv1connect.SandboxServiceClient) error {
		res, err := g.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"echo", "ok"}}))
		if err == nil && string(res.Msg.GetStdout()) != "ok\n" {
			return fmt.Errorf("exec output %q", res.Msg.GetStdout())
		}
		return err
	})
	c.execs.Add(1)
	if err != nil {
		// A sandbox whose runner crashed while starting it may have failed: that must be
		// visible as FAILED with a reason, not lost.
		st, gerr := c.clients[0].GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if gerr == nil && st.Msg.GetStatus().GetState() == sandboxv1.State_STATE_FAILED && st.Msg.GetStatus().GetStateReason() != "" {
			c.interrupted.Add(1)
		} else {
			c.fail("exec in %s (runner %s): %v (state %v)", id, sb.GetStatus().GetRunnerId(), err, st)
		}
	}

	err = c.call(ctx, "delete", func(ctx context.Context, g sandboxv1connect.SandboxServiceClient) error {
		_, err := g.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		return err
	})
	c.deletes.Add(1)
	if err != nil {
		c.fail("delete %s: %v", id, err)
		return
	}
	c.mu.Lock()
	c.deleted[id] = true
	c.mu.Unlock()
}

// TestChurnWithFaults runs a churn of sandbox creates, execs and deletes through both
// gateway replicas while one runner, one gateway and the control plane are each killed
// with SIGKILL and restarted; then checks that nothing was lost or leaked: the gateways'
// index equals the union of the runners' sandboxes, every acknowledged create is
// accounted for, and sandboxes that were running before the faults still run.
func TestChurnWithFaults(t *testing.T) {
	b := startBed(t, "--orphan-grace", "5s", "--reconcile-interval", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := &churn{b: b, clients: []sandboxv1connect.SandboxServiceClient{b.Sandboxes(0), b.Sandboxes(1)},
		acked: map[string]string{}, deleted: map[string]bool{}}

	// Sandboxes that must outlive every fault, on every runner.
	type kept struct {
		id, runner string
		started    time.Time
	}
	var keep []kept
	for _, r := range []string{"strict", "open", "open", "small", "strict", "open"} {
		res, err := c.clients[0].CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			RunnerIds: []string{r}, Mode: sandboxv1.SandboxMode_SANDBOX_MODE_CKS,
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh",
				Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`}, Resources: &sandboxv1.Resources{Cpu: "100m", Memory: "64Mi"}}},
		}}}))
		if err != nil {
			t.Fatalf("long-lived sandbox on %s: %v", r, err)
		}
		keep = append(keep, kept{id: res.Msg.GetSandboxId(), runner: r})
	}
	for i, k := range keep {
		if _, err := c.clients[1].Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: k.id, Command: []string{"true"}})); err != nil {
			t.Fatalf("exec in long-lived %s: %v", k.id, err)
		}
		st, err := c.clients[1].GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: k.id}))
		if err != nil {
			t.Fatal(err)
		}
		keep[i].started = st.Msg.GetStatus().GetStartTime().AsTime()
	}

	// Faults, one after another, while the churn runs.
	var (
		faultLog  []string
		whileDown []string // what a sandbox of the killed runner answered meanwhile
	)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		step := func(p *testbed.Proc, down time.Duration) {
			time.Sleep(3 * time.Second)
			t0 := time.Now()
			p.Kill()
			if p == b.Runners[1] {
				// Its sandboxes are unavailable, retryably, not failed.
				time.Sleep(time.Second)
				_, err := c.clients[1].Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: keep[1].id, Command: []string{"true"}}))
				if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable {
					whileDown = append(whileDown, fmt.Sprintf("exec: %v, want UNAVAILABLE %s", err, apierr.RunnerUnavailable))
				}
				st, err := c.clients[1].GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: keep[1].id}))
				if err != nil || st.Msg.GetStatus().GetState() != sandboxv1.State_STATE_RUNNING {
					whileDown = append(whileDown, fmt.Sprintf("get: %v %v, want RUNNING as last seen", st, err))
				}
			}
			time.Sleep(down)
			if err := p.Restart(ctx); err != nil {
				c.fail("restart %s: %v", p.Name, err)
				return
			}
			faultLog = append(faultLog, fmt.Sprintf("%s killed -9, back after %v", p.Name, time.Since(t0).Round(100*time.Millisecond)))
		}
		step(b.Runners[1], 4*time.Second) // open: the roomiest runner
		step(b.Gateways[0], 3*time.Second)
		step(b.CP, 4*time.Second)
	}()

	t0 := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := range churnWorkers {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				select {
				case <-faultsDone:
					if c.creates.Load()+c.execs.Load()+c.deletes.Load() >= minOps {
						return
					}
				default:
				}
				c.cycle(ctx, w, n)
				next.Add(1)
			}
		})
	}
	wg.Wait()
	<-faultsDone
	churnTime := time.Since(t0)
	for _, e := range whileDown {
		t.Errorf("a sandbox of the killed runner: %s", e)
	}
	for _, e := range c.errs {
		t.Errorf("churn: %s", e)
	}

	// Every runner is back: both gateways see three healthy runners.
	waitFor(t, ctx, "three healthy runners on both gateways", func() bool {
		for i := range b.Gateways {
			res, err := b.Discovery(i).ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{HealthyOnly: true}))
			if err != nil || len(res.Msg.GetRunners()) != 3 {
				return false
			}
		}
		return true
	})

	// The long-lived sandboxes kept running, the same process since before the faults.
	keptRunning := 0
	for _, k := range keep {
		for i, g := range c.clients {
			st, err := g.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: k.id}))
			if err != nil || st.Msg.GetStatus().GetState() != sandboxv1.State_STATE_RUNNING ||
				!st.Msg.GetStatus().GetStartTime().AsTime().Equal(k.started) {
				t.Errorf("long-lived %s on %s through gateway %d (started %v): %v %v", k.id, k.runner, i, k.started.UnixNano(), st.Msg.GetStatus(), err)
				continue
			}
			if _, err := g.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: k.id, Command: []string{"true"}})); err != nil {
				t.Errorf("exec in long-lived %s through gateway %d: %v", k.id, i, err)
				continue
			}
			if i == 0 {
				keptRunning++
			}
		}
	}

	// Every acknowledged create is known to both gateways, ended if it was deleted.
	missing := 0
	for id := range c.acked {
		for i, g := range c.clients {
			st, err := g.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			switch {
			case err != nil:
				missing++
				t.Errorf("acknowledged sandbox %s unknown to gateway %d: %v", id, i, err)
			case c.deleted[id] && !terminal(st.Msg.GetStatus().GetState()) && st.Msg.GetStatus().GetState() != sandboxv1.State_STATE_TERMINATING:
				t.Errorf("deleted sandbox %s is %v on gateway %d", id, st.Msg.GetStatus().GetState(), i)
			}
		}
	}

	// The index equals the union of the runners' live sandboxes (the reconciler removes
	// what interrupted creates left on runners within its grace of 5 s).
	runners := runnerClients(t, b)
	var index, union []string
	waitFor(t, ctx, "gateway index = union of the runners' sandboxes", func() bool {
		index, union = nil, nil
		for i := range b.Gateways {
			res, err := b.Sandboxes(i).ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{PageSize: 1000}))
			if err != nil {
				return false
			}
			var ids []string
			for _, sb := range res.Msg.GetSandboxes() {
				if s := sb.GetStatus().GetState(); !terminal(s) && s != sandboxv1.State_STATE_TERMINATING {
					ids = append(ids, sb.GetSandboxId())
				}
			}
			slices.Sort(ids)
			if i > 0 && !slices.Equal(ids, index) {
				return false
			}
			index = ids
		}
		for _, r := range runners {
			sbs, err := r.List(ctx)
			if err != nil {
				return false
			}
			for _, sb := range sbs {
				if !sb.State.Terminal() && sb.State.String() != "TERMINATING" {
					union = append(union, sb.ID)
				}
			}
		}
		slices.Sort(union)
		return slices.Equal(index, union)
	})
	orphans := 0
	for _, g := range b.Gateways {
		log, _ := os.ReadFile(g.Log())
		orphans += strings.Count(string(log), "deleting a sandbox no gateway knows")
	}

	summary := fmt.Sprintf("fault test: %d operations in %v (%d creates, %d execs, %d deletes; %d retries), faults: %s; "+
		"%d creates acknowledged, %d missing from an index, %d failed by a runner crash (reported FAILED), %d interrupted creates cleaned up by the reconciler; "+
		"index %d = runners %d; long-lived sandboxes kept running %d/%d",
		c.creates.Load()+c.execs.Load()+c.deletes.Load(), churnTime.Round(time.Second), c.creates.Load(), c.execs.Load(), c.deletes.Load(), c.retries.Load(),
		strings.Join(faultLog, ", "), len(c.acked), missing, c.interrupted.Load(), orphans, len(index), len(union), keptRunning, len(keep))
	t.Log(summary)
	fmt.Println(summary)
	if ops := c.creates.Load() + c.execs.Load() + c.deletes.Load(); ops < minOps {
		t.Errorf("only %d operations", ops)
	}
	if len(faultLog) != 3 {
		t.Errorf("faults: %v", faultLog)
	}
}

func terminal(s sandboxv1.State) bool {
	switch s {
	case sandboxv1.State_STATE_COMPLETED, sandboxv1.State_STATE_FAILED, sandboxv1.State_STATE_TERMINATED:
		return true
	}
	return false
}

// runnerClients reach each runner of b directly over mTLS, as a gateway would.
func runnerClients(t *testing.T, b *testbed.Bed) []*runnerapi.Client {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(filepath.Dir(b.CAFile), "unused: the CA exists")
	if err != nil {
		t.Fatal(err)
	}
	var out []*runnerapi.Client
	for i, r := range testbed.Standard() {
		tc, err := runnerapi.ClientTLSConfig(ca, "fault-test", r.ID)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := runnerapi.NewClient(runnerapi.ClientConfig{ID: r.ID, Addr: b.RunnerAddr(i), TLS: tc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		out = append(out, rc)
	}
	return out
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
