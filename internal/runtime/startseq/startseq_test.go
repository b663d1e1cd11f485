package startseq_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
)

// fakeOps is a backend whose containers' exits and probe results the test scripts.
type fakeOps struct {
	mu      sync.Mutex
	events  []string                // "start x", "exec x", "exit x"
	exits   map[string]chan int32   // closed by the test (or at once for codes set in exitNow)
	exitNow map[string]int32        // containers that exit at once with this code
	healthy map[string]int          // probe attempts until x passes (0 = first); -1 never
	probes  map[string]int          // attempts so far
	startOK func(name string) error // nil = every start works
}

func newFake() *fakeOps {
	return &fakeOps{exits: map[string]chan int32{}, exitNow: map[string]int32{}, healthy: map[string]int{}, probes: map[string]int{}}
}

func (f *fakeOps) log(e string) {
	f.mu.Lock()
	f.events = append(f.events, e)
	f.mu.Unlock()
}

func (f *fakeOps) Start(ctx context.Context, name string) error {
	if f.startOK != nil {
		if err := f.startOK(name); err != nil {
			return err
		}
	}
	f.log("start " + name)
	return nil
}

func (f *fakeOps) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (int, error) {
	f.mu.Lock()
	n := f.probes[name]
	f.probes[name]++
	want, ok := f.healthy[name]
	f.mu.Unlock()
	f.log("exec " + name)
	if ok && (want < 0 || n < want) {
		return 1, nil
	}
	return 0, nil
}

func (f *fakeOps) Wait(ctx context.Context, name string) (int32, error) {
	f.mu.Lock()
	code, now := f.exitNow[name]
	ch := f.exits[name]
	f.mu.Unlock()
	if now {
		f.log("exit " + name)
		return code, nil
	}
	if ch == nil {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	select {
	case code := <-ch:
		f.log("exit " + name)
		return code, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (f *fakeOps) index(e string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Index(f.events, e)
}

func probe() *runtime.Probe {
	return &runtime.Probe{Exec: []string{"true"}, Period: time.Millisecond, FailureThreshold: 5}
}

func group(cs ...runtime.Container) *runtime.Spec {
	s := &runtime.Spec{ID: "sb", Container: cs[0]}
	s.Sidecars = cs[1:]
	return s
}

func TestInitContainersRunInOrderFirst(t *testing.T) {
	f := newFake()
	f.exitNow["a"], f.exitNow["b"] = 0, 0
	s := group(runtime.Container{Name: "main"}, runtime.Container{Name: "side"})
	s.InitContainers = []runtime.Container{{Name: "a"}, {Name: "b"}}
	if err := startseq.Run(context.Background(), s, f); err != nil {
		t.Fatal(err)
	}
	order := []int{f.index("start a"), f.index("exit a"), f.index("start b"), f.index("exit b"), f.index("start main"), f.index("start side")}
	if order[0] != 0 || order[1] != 1 || order[2] != 2 || order[3] != 3 || order[4] < 4 || order[5] < 4 {
		t.Fatalf("events %v: want init a, then b, each to its exit, then the others", f.events)
	}
}

func TestFailingInitContainerFailsNamingIt(t *testing.T) {
	f := newFake()
	f.exitNow["a"], f.exitNow["b"] = 0, 3
	s := group(runtime.Container{Name: "main"})
	s.InitContainers = []runtime.Container{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	err := startseq.Run(context.Background(), s, f)
	var fl *startseq.Failure
	if !errors.As(err, &fl) || fl.Container != "b" || fl.Reason != startseq.ReasonInitFailed || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), "code 3") {
		t.Fatalf("err = %v, want an InitContainerFailed failure naming b and its code", err)
	}
	if f.index("start c") >= 0 || f.index("start main") >= 0 {
		t.Fatalf("events %v: nothing may start after a failed init container", f.events)
	}
}

func TestDependsOnConditions(t *testing.T) {
	f := newFake()
	f.healthy["db"] = 3 // passes on the 4th attempt
	f.exits["migrate"] = make(chan int32, 1)
	db := runtime.Container{Name: "db", StartupProbe: probe()}
	migrate := runtime.Container{Name: "migrate", DependsOn: []runtime.Dependency{{Container: "db", Condition: runtime.ConditionHealthy}}}
	api := runtime.Container{Name: "api", DependsOn: []runtime.Dependency{{Container: "migrate", Condition: runtime.ConditionCompleted}}}
	web := runtime.Container{Name: "web", DependsOn: []runtime.Dependency{{Container: "api", Condition: runtime.ConditionStarted}, {Container: "db", Condition: runtime.ConditionHealthy}}}
	s := group(web, db, migrate, api)
	done := make(chan error, 1)
	go func() { done <- startseq.Run(context.Background(), s, f) }()
	// api waits for migrate to complete.
	time.Sleep(50 * time.Millisecond)
	if f.index("start api") >= 0 || f.index("start web") >= 0 {
		t.Fatalf("events %v: api and web started before migrate completed", f.events)
	}
	f.exits["migrate"] <- 0
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if f.probes["db"] != 4 {
		t.Errorf("db was probed %d times, want 4 (until it passed)", f.probes["db"])
	}
	before := func(a, b string) {
		if ia, ib := f.index(a), f.index(b); ia < 0 || ib < 0 || ia > ib {
			t.Errorf("events %v: want %q before %q", f.events, a, b)
		}
	}
	before("start db", "start migrate")
	before("exec db", "start migrate")
	before("exit migrate", "start api")
	before("start api", "start web")
}

func TestCompletedWithNonZeroFailsTheDependent(t *testing.T) {
	f := newFake()
	f.exitNow["migrate"] = 2
	s := group(runtime.Container{Name: "main", DependsOn: []runtime.Dependency{{Container: "migrate", Condition: runtime.ConditionCompleted}}}, runtime.Container{Name: "migrate"})
	err := startseq.Run(context.Background(), s, f)
	var fl *startseq.Failure
	if !errors.As(err, &fl) || fl.Container != "main" || fl.Reason != startseq.ReasonDependencyFailed || !strings.Contains(fl.Message, `"migrate"`) {
		t.Fatalf("err = %v, want a DependencyFailed failure of main naming migrate", err)
	}
	if f.index("start main") >= 0 {
		t.Fatal("main started although migrate failed")
	}
}

func TestProbeThatNeverPassesFailsNamingTheContainer(t *testing.T) {
	f := newFake()
	f.healthy["redis"] = -1
	p := probe()
	p.FailureThreshold = 3
	s := group(runtime.Container{Name: "app", DependsOn: []runtime.Dependency{{Container: "redis", Condition: runtime.ConditionHealthy}}}, runtime.Container{Name: "redis", StartupProbe: p})
	err := startseq.Run(context.Background(), s, f)
	var fl *startseq.Failure
	if !errors.As(err, &fl) || fl.Container != "redis" || fl.Reason != startseq.ReasonProbeFailed || !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("err = %v, want a StartupProbeFailed failure of redis after 3 attempts", err)
	}
	if f.probes["redis"] != 3 || f.index("start app") >= 0 {
		t.Fatalf("redis probed %d times (want 3), events %v: app must not start", f.probes["redis"], f.events)
	}
}

func TestEveryProbeMustPass(t *testing.T) {
	f := newFake()
	f.healthy["side"] = -1
	p := probe()
	p.FailureThreshold = 2
	s := group(runtime.Container{Name: "main"}, runtime.Container{Name: "side", StartupProbe: p})
	var fl *startseq.Failure
	if err := startseq.Run(context.Background(), s, f); !errors.As(err, &fl) || fl.Container != "side" {
		t.Fatalf("err = %v: a probe nobody depends on must still pass", err)
	}
}

func TestStartErrorAndCancel(t *testing.T) {
	f := newFake()
	f.startOK = func(name string) error {
		if name == "side" {
			return errors.New("image gone")
		}
		return nil
	}
	s := group(runtime.Container{Name: "main"}, runtime.Container{Name: "side"})
	var fl *startseq.Failure
	if err := startseq.Run(context.Background(), s, f); !errors.As(err, &fl) || fl.Container != "side" || fl.Reason != startseq.ReasonStartError || !strings.Contains(fl.Message, "image gone") {
		t.Fatalf("err = %v, want a StartError of side with the cause", err)
	}

	// A dependency that never completes holds its dependent until ctx ends.
	f = newFake()
	f.exits["slow"] = make(chan int32)
	s = group(runtime.Container{Name: "main", DependsOn: []runtime.Dependency{{Container: "slow", Condition: runtime.ConditionCompleted}}}, runtime.Container{Name: "slow"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := startseq.Run(ctx, s, f); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
}

func TestSingleContainer(t *testing.T) {
	f := newFake()
	s := &runtime.Spec{ID: "sb", Container: runtime.Container{Image: "busybox"}}
	if err := startseq.Run(context.Background(), s, f); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.events, []string{"start main"}) {
		t.Fatalf("events %v", f.events)
	}
}
