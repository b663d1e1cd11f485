package runner

import (
	"context"
	"log/slog"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// idleRunner is a Local offering cpu and 8 GiB over a backend that runs nothing:
// its sandboxes start at once and stay alive, like idle sandboxes, until stopped.
// recovered are what it finds as a restarted runner.
func idleRunner(t *testing.T, milliCPU int64, recovered ...runtime.Recovered) *Local {
	t.Helper()
	be := runtimetest.NewFake()
	for _, rec := range recovered {
		be.Put(rec)
	}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	l := NewLocal("r1", r)
	l.MilliCPU, l.MemoryBytes = milliCPU, 8<<30
	return l
}

func admit(l *Local, res runtime.Resources) (Sandbox, error) {
	return l.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Resources: res}}})
}

// TestRunnerAdmitsByRequests: a 2-CPU runner admits sandboxes by their requests with its
// CPU overcommit, a sandbox that asks for nothing by the default request (and runs
// limited by the default limit); beyond capacity × overcommit it says "no room now",
// and for a request above its whole capacity "never".
func TestRunnerAdmitsByRequests(t *testing.T) {
	l := idleRunner(t, 2000)
	if l.CPUOvercommit != DefaultCPUOvercommit || l.Defaults != DefaultResources {
		t.Fatalf("a new local runner: overcommit %v, defaults %+v", l.CPUOvercommit, l.Defaults)
	}
	// The report's case: four idle sandboxes of 500m, then another 500m one.
	for i := range 4 {
		if _, err := admit(l, runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}); err != nil {
			t.Fatalf("idle sandbox %d: %v", i, err)
		}
	}
	var defaulted []Sandbox
	for i := range 15 {
		sb, err := admit(l, runtime.Resources{})
		if err != nil {
			t.Fatalf("default sandbox %d: %v", i, err)
		}
		defaulted = append(defaulted, sb)
	}
	if _, err := admit(l, runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20}); err != nil {
		t.Fatalf("a 500m sandbox beside four idle ones and 15 default ones: %v", err)
	}
	c, err := l.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(5*500 + 15*100); c.UsedMilliCPU != want || c.UsedMemoryBytes != 5*256<<20+15*128<<20 || c.Running != 20 {
		t.Errorf("used %dm CPU, %d bytes by %d sandboxes; want %dm by their requests", c.UsedMilliCPU, c.UsedMemoryBytes, c.Running, want)
	}
	// None runs unlimited: a default sandbox goes to the backend with the default limits.
	if got := defaulted[0].Spec.Resources; got.MilliCPU != 1000 || got.MemoryBytes != 1<<30 || got.RequestMilliCPU != 100 || got.RequestMemoryBytes != 128<<20 {
		t.Errorf("default sandbox's resources %+v, want 100m/128Mi requested, 1 CPU/1Gi limits", got)
	}

	// 4000m of 8000m (2 CPUs × 4) are taken: four 1-CPU sandboxes fit, a fifth has no room.
	for i := range 4 {
		if _, err := admit(l, runtime.Resources{MilliCPU: 1000}); err != nil {
			t.Fatalf("1-CPU sandbox %d: %v", i, err)
		}
	}
	_, err = admit(l, runtime.Resources{MilliCPU: 1000})
	if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.RunnerCapacityExhausted || apierr.RetryInfo(err) == nil {
		t.Errorf("beyond capacity × overcommit: %v, want RESOURCE_EXHAUSTED %s with RetryInfo", err, apierr.RunnerCapacityExhausted)
	}
	// A deleted sandbox frees its request.
	if _, err := l.Delete(context.Background(), defaulted[0].ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.R.WaitTerminal(context.Background(), defaulted[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admit(l, runtime.Resources{MilliCPU: 100}); err != nil {
		t.Errorf("after a delete: %v", err)
	}

	// More than the runner has at all never fits, however empty it is.
	_, err = admit(l, runtime.Resources{MilliCPU: 3000})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner || apierr.RetryInfo(err) != nil {
		t.Fatalf("3 CPUs on a 2-CPU runner: %v, want FAILED_PRECONDITION %s without RetryInfo", err, apierr.NoSuitableRunner)
	}
	vs := apierr.Violations(err)
	if len(vs) != 1 || vs[0].Field != "runner[r1].sandbox.spec.containers[0].resource_requirements.requests.cpu" {
		t.Errorf("violations %v, want the runner and the request", vs)
	}
}

// TestRecoveredSandboxesCountByRequests: sandboxes a restarted runner re-adopts count by
// the same rule as new ones, also those recorded before sandboxes had requests.
func TestRecoveredSandboxesCountByRequests(t *testing.T) {
	alive := func(id string, res runtime.Resources) runtime.Recovered {
		return runtime.Recovered{Spec: runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Resources: res}}, Alive: true}
	}
	l := idleRunner(t, 2000,
		alive("unlimited", runtime.Resources{}),                                   // from before defaults: the default request
		alive("limited", runtime.Resources{MilliCPU: 1500, MemoryBytes: 1 << 30}), // a limit alone: also the request
		alive("requested", runtime.Resources{RequestMilliCPU: 250, MilliCPU: 2000, RequestMemoryBytes: 64 << 20, MemoryBytes: 1 << 30}),
	)
	c, err := l.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Running != 3 || c.UsedMilliCPU != 100+1500+250 || c.UsedMemoryBytes != 128<<20+1<<30+64<<20 {
		t.Errorf("recovered: %d sandboxes using %dm CPU, %d bytes", c.Running, c.UsedMilliCPU, c.UsedMemoryBytes)
	}
}

func TestLiveOfCountsOneOrganization(t *testing.T) {
	sb := func(org string, st State) Sandbox {
		return Sandbox{State: st, Spec: runtime.Spec{Meta: map[string]string{runtime.MetaOrg: org}}}
	}
	sbs := []Sandbox{sb("a", StateRunning), sb("a", StateCreating), sb("a", StateTerminated),
		sb("b", StateRunning), sb("b", StateRunning), {State: StateRunning}}
	for org, want := range map[string]int{"a": 2, "b": 2, "c": 0, "": 1} {
		if got := LiveOf(sbs, org); got != want {
			t.Errorf("LiveOf(%q) = %d, want %d", org, got, want)
		}
	}
}
