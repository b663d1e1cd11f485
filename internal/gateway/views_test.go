package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// scriptedRunner answers Capacity with what the test sets: the probe's inputs. (A real
// runner cannot be made to time out on cue; everything else about runners is tested
// against real ones in test/e2e and test/multicluster.)
type scriptedRunner struct {
	id string
	mu sync.Mutex
	c  runner.Capacity
	// err is returned instead of c when set.
	err error
}

func (r *scriptedRunner) set(c runner.Capacity, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.c, r.err = c, err
}

func (r *scriptedRunner) ID() string    { return r.id }
func (r *scriptedRunner) Group() string { return "default" }
func (r *scriptedRunner) Create(context.Context, runner.CreateRequest) (runner.Sandbox, error) {
	return runner.Sandbox{}, errors.New("not used")
}
func (r *scriptedRunner) Get(context.Context, string) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (r *scriptedRunner) Delete(context.Context, string, time.Duration) (runner.Sandbox, error) {
	return runner.Sandbox{}, runtime.ErrNotFound
}
func (r *scriptedRunner) Agent(context.Context, string, string) (agentv1connect.AgentServiceClient, error) {
	return nil, errors.New("not used")
}
func (r *scriptedRunner) Logs(context.Context, string, string, *agentv1.LogsRequest, func(*agentv1.LogsResponse) error) error {
	return errors.New("not used")
}
func (r *scriptedRunner) Capacity(context.Context) (runner.Capacity, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.c, r.err
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestRunnerViews(t *testing.T) {
	ctx := context.Background()
	r := &scriptedRunner{id: "r1"}
	s := &Server{runners: []runner.Handle{r}, log: slog.New(slog.DiscardHandler)}
	v := newRunnerViews(s, 200*time.Millisecond)
	full := runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, MaxSandboxes: 10, UsedMilliCPU: 1000, Running: 1, CPUOvercommit: 4, Defaults: runner.DefaultResources}
	r.set(full, nil)

	one := func() placement.Runner {
		t.Helper()
		vs := v.snapshot(ctx)
		if len(vs) != 1 {
			t.Fatalf("%d views", len(vs))
		}
		return vs[0]
	}

	// A gateway that just started probes before its first placement.
	if got := one(); !got.Ready || got.Used.MilliCPU != 1000 || got.Sandboxes != 1 || got.Policy == nil {
		t.Fatalf("first view %+v", got)
	}
	// Placement resolves with the runner's defaults and admits by its overcommit.
	if got := one(); got.CPUOvercommit != 4 || got.Defaults.Requests.CPU != "100m" || got.Defaults.Requests.Memory != "128Mi" ||
		got.Defaults.Limits.CPU != "1" || got.Defaults.Limits.Memory != "1Gi" {
		t.Errorf("the runner's admission terms: overcommit %v, defaults %+v", got.CPUOvercommit, got.Defaults)
	}

	// A create this gateway made counts until a probe that started after it reports it.
	v.confirmed(0, placement.Resources{MilliCPU: 500, MemoryBytes: 1 << 30})
	if got := one(); got.Used.MilliCPU != 1500 || got.Used.MemoryBytes != 1<<30 || got.Sandboxes != 2 {
		t.Errorf("after a confirmed create: %+v", got)
	}
	full.UsedMilliCPU, full.UsedMemoryBytes, full.Running = 1500, 1<<30, 2
	r.set(full, nil)
	v.probe(ctx)
	if got := one(); got.Used.MilliCPU != 1500 || got.Sandboxes != 2 {
		t.Errorf("after the probe that reports it: %+v (counted twice?)", got)
	}

	// A probe that times out keeps the last view for a while; then the runner is gone.
	r.set(runner.Capacity{}, timeoutErr{})
	v.probe(ctx)
	if got := one(); !got.Ready || got.Used.MilliCPU != 1500 {
		t.Errorf("right after a timed-out probe: %+v, want the last view", got)
	}
	time.Sleep(250 * time.Millisecond)
	v.probe(ctx)
	if got := one(); got.Ready || got.NotReady == "" {
		t.Errorf("after timing out for longer than disconnectAfter: %+v", got)
	}

	// A refused connection disconnects at once; the next good probe reconnects.
	r.set(full, nil)
	v.probe(ctx)
	if !one().Ready {
		t.Fatal("not reconnected")
	}
	r.set(runner.Capacity{}, syscall.ECONNREFUSED)
	v.probe(ctx)
	if got := one(); got.Ready || got.NotReady != syscall.ECONNREFUSED.Error() {
		t.Errorf("after a refused probe: %+v", got)
	}
	r.set(full, nil)
	v.probe(ctx)
	v.markDown(0, errors.New("create failed: unreachable"))
	if got := one(); got.Ready || got.NotReady != "create failed: unreachable" {
		t.Errorf("after markDown: %+v", got)
	}

	// Policies are read on every placement, parsed once per revision, and a policy
	// that cannot be read makes the runner unplaceable with the reason.
	r.set(full, nil)
	v.probe(ctx)
	s.policies = policyFunc(func() ([]byte, int64, error) {
		return []byte(`{"constraints": {"lifetime": {"max_seconds": 60}}}`), 2, nil
	})
	first := one()
	if first.PolicyRevision != "2" || first.Policy.Constraints.Lifetime == nil {
		t.Fatalf("policy revision 2: %+v", first)
	}
	if again := one(); again.Policy != first.Policy {
		t.Error("the same revision was parsed again")
	}
	s.policies = policyFunc(func() ([]byte, int64, error) { return nil, 0, errors.New("store down") })
	if got := one(); got.Ready || got.NotReady == "" {
		t.Errorf("with no policy to read: %+v", got)
	}
}

type policyFunc func() ([]byte, int64, error)

func (f policyFunc) Policy(context.Context, string) ([]byte, int64, error) { return f() }
