package runnerapi

import (
	"context"
	"net"
	"sync"
	"testing"

	"connectrpc.com/connect"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// warmFake is a fakeRunner that keeps warm pools: it records the sets it is given.
type warmFake struct {
	*fakeRunner
	mu   sync.Mutex
	sets [][]runtime.WarmTarget
}

func (f *warmFake) SetWarmPools(_ context.Context, targets []runtime.WarmTarget) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, targets)
	return nil
}

func (f *warmFake) last() []runtime.WarmTarget {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil
	}
	return f.sets[len(f.sets)-1]
}

func warmSpec(milliCPU int64) *runnerv1.Spec {
	return specToProto(runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep",
		Resources: runtime.Resources{RequestMilliCPU: milliCPU, MilliCPU: milliCPU}}})
}

// SetWarmPools over the runner wire: the runner's own policy filters the targets, sizes
// and counts are bounded, and a runner that keeps no warm pools says so.
func TestSetWarmPools(t *testing.T) {
	ctx := context.Background()
	fake := &warmFake{fakeRunner: &fakeRunner{}}
	srv := newServer(fake, nil, nil).WithPolicy("r1", staticPolicy(`{"constraints": {"resources": {"max_cpu": "1"}}}`))
	res, err := srv.SetWarmPools(ctx, connect.NewRequest(&runnerv1.SetWarmPoolsRequest{Targets: []*runnerv1.WarmTarget{
		{Key: "acme/small", Spec: warmSpec(500), Size: 2},
		{Key: "acme/big", Spec: warmSpec(2000), Size: 3}, // its policy rejects it: left out
	}}))
	if err != nil {
		t.Fatal(err)
	}
	got := fake.last()
	if res.Msg.GetAccepted() != 1 || len(got) != 1 || got[0].Key != "acme/small" || got[0].Size != 2 || got[0].Spec.Image != "busybox" {
		t.Fatalf("accepted %d, backend got %+v", res.Msg.GetAccepted(), got)
	}
	// Replace-whole: an empty set reaches the backend as such.
	if _, err := srv.SetWarmPools(ctx, connect.NewRequest(&runnerv1.SetWarmPoolsRequest{})); err != nil || len(fake.last()) != 0 || len(fake.sets) != 2 {
		t.Fatalf("empty set: %v, %+v", err, fake.sets)
	}
	_, err = srv.SetWarmPools(ctx, connect.NewRequest(&runnerv1.SetWarmPoolsRequest{Targets: []*runnerv1.WarmTarget{{Key: "k", Spec: warmSpec(0), Size: runtime.MaxWarmSize + 1}}}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || len(apierr.Violations(err)) != 1 || apierr.Violations(err)[0].Field != "targets[0].size" {
		t.Fatalf("size over the bound: %v", err)
	}
	many := make([]*runnerv1.WarmTarget, MaxWarmTargets+1)
	for i := range many {
		many[i] = &runnerv1.WarmTarget{Spec: warmSpec(0), Size: 1}
	}
	if _, err := srv.SetWarmPools(ctx, connect.NewRequest(&runnerv1.SetWarmPoolsRequest{Targets: many})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("too many targets: %v", err)
	}
	if n := len(fake.sets); n != 2 {
		t.Fatalf("refused calls reached the backend: %d sets", n)
	}
	// A runner without warm pools.
	plain := newServer(&fakeRunner{}, nil, nil)
	if _, err := plain.SetWarmPools(ctx, connect.NewRequest(&runnerv1.SetWarmPoolsRequest{})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("runner without warm pools: %v", err)
	}
}

// The client sends the targets whole (key, spec, size) over mTLS.
func TestSetWarmPoolsClient(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	fake := &warmFake{fakeRunner: &fakeRunner{}}
	srv := newServer(fake, nil, nil).HTTPServer(scfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	c := (&testRunner{addr: ln.Addr().String(), ca: ca}).client(t)
	spec := runtime.Spec{Container: runtime.Container{Image: "busybox", Command: "sleep", Args: []string{"inf"}}, RuntimeClass: "runc"}
	reg := runtime.Spec{Container: runtime.Container{Image: "reg.example/a/app:v1", Command: "sleep",
		PullCredentials: &runtime.Credentials{Username: "sandboxd", Password: "tok"}}, Meta: map[string]string{runtime.MetaOrg: "a"}}
	if err := c.SetWarmPools(context.Background(), []runtime.WarmTarget{{Key: "a/b", Spec: spec, Size: 4}, {Key: "a/reg", Spec: reg, Size: 1}}); err != nil {
		t.Fatal(err)
	}
	got := fake.last()
	if len(got) != 2 || got[0].Key != "a/b" || got[0].Size != 4 || got[0].Spec.Image != "busybox" || got[0].Spec.RuntimeClass != "runc" ||
		len(got[0].Spec.Args) != 1 {
		t.Fatalf("runner got %+v", got)
	}
	// A registry image's target keeps its pull credentials and organization (the pool keys
	// such containers by it).
	if c := got[1].Spec.PullCredentials; c == nil || c.Password != "tok" || got[1].Spec.Meta[runtime.MetaOrg] != "a" {
		t.Fatalf("registry target arrived as %+v", got[1].Spec)
	}
	// And a runner that keeps none answers UNIMPLEMENTED.
	plain := startRunner(t, &fakeRunner{}).client(t)
	if err := plain.SetWarmPools(context.Background(), nil); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("err = %v", err)
	}
}
