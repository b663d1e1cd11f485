package security

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	runnerv1 "github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/runner/v1/runnerv1connect"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// porterFake is a runtimetest.Fake whose checkpoints move through the blob store: its
// export hands out egress state st (a real CA and key) and one part; imports only count.
type porterFake struct {
	*runtimetest.Fake
	st      *runtime.EgressState
	mu      sync.Mutex
	imports int
}

func (f *porterFake) CheckpointPlatform(string) string { return "p" }
func (f *porterFake) ExportCheckpoint(ctx context.Context, id string, put func(context.Context, string, io.Reader) error) (runtime.CheckpointExport, error) {
	if err := put(ctx, "image", strings.NewReader("image of "+id)); err != nil {
		return runtime.CheckpointExport{}, err
	}
	return runtime.CheckpointExport{Platform: "p", Class: "fake", Parts: []string{"image"}, Bytes: 9, Egress: f.st}, nil
}
func (f *porterFake) ForkFromCheckpoint(_ context.Context, _ runtime.CheckpointExport, _ func(context.Context, string) (io.ReadCloser, error), specs []*runtime.Spec) ([]runtime.Info, []error) {
	f.mu.Lock()
	f.imports++
	f.mu.Unlock()
	errs := make([]error, len(specs))
	for i := range errs {
		errs[i] = fmt.Errorf("not made")
	}
	return make([]runtime.Info, len(specs)), errs
}

// TestRunnerAPIEgressStateAttack (docs/secrets.md, "Forks and moves"): a caller of the
// runner API's ImportFork (not the gateway, which passes an export's state through as
// it is) hands a runner hostile egress states with a real checkpoint: another sandbox's
// CA key, a CA without name constraints (one that could sign for any host the sandbox
// trusts), an injection for a host the sandbox has no secret for, a carried value, a
// huge key, 10 000 injections, and none at all. Each is refused with INVALID_ARGUMENT
// naming ref.egress before the backend is asked to make anything.
func TestRunnerAPIEgressStateAttack(t *testing.T) {
	store, err := dir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := func(host string) *runtime.EgressState {
		ph, _ := egress.NewPlaceholder()
		ss, err := egress.NewSandboxSecrets("src", "org-a", []egress.Injection{{Host: host, Header: "Authorization", Placeholder: ph, Value: "v", Secret: "prod/api#token"}}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert, key, injs, err := ss.Export()
		if err != nil {
			t.Fatal(err)
		}
		return &runtime.EgressState{CACert: cert, CAKey: key, Injections: []runtime.EgressInjection{{Host: injs[0].Host, Header: injs[0].Header, Placeholder: injs[0].Placeholder, Secret: injs[0].Secret}}}
	}
	serve := func(id string, be *porterFake) runnerv1connect.RunnerServiceClient {
		t.Cleanup(be.Close)
		r, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), Blobs: store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		srv := httptest.NewServer(runnerapi.NewServer(id, r, nil).Handler())
		t.Cleanup(srv.Close)
		if id == "r1" {
			net := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
				Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}}
			if _, err := r.Create(context.Background(), runner.CreateRequest{Spec: runtime.Spec{ID: "src1", Container: runtime.Container{Image: "busybox"}, Network: net,
				EgressSecretValues: map[string]string{"prod/api#token": "v"}, Meta: map[string]string{runtime.MetaOrg: "org-a"}}, Lifetime: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		return runnerv1connect.NewRunnerServiceClient(srv.Client(), srv.URL)
	}
	good := state("api.example.com")
	a := serve("r1", &porterFake{Fake: runtimetest.NewFake(), st: good})
	bBackend := &porterFake{Fake: runtimetest.NewFake()}
	b := serve("r2", bBackend)
	ctx := context.Background()
	var exp *connect.Response[runnerv1.ExportCheckpointResponse]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if exp, err = a.ExportCheckpoint(ctx, connect.NewRequest(&runnerv1.ExportCheckpointRequest{Id: "src1"})); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if e := exp.Msg.GetRef().GetEgress(); e == nil || string(e.GetCaKey()) != string(good.CAKey) {
		t.Fatal("the export's ref does not carry the egress state")
	}
	other := state("api.example.com")
	evil := state("evil.example.com")
	mod := func(f func(e *runnerv1.EgressState)) *runnerv1.CheckpointRef {
		ref := proto.CloneOf(exp.Msg.GetRef())
		if f != nil {
			f(ref.Egress)
		}
		return ref
	}
	for name, ref := range map[string]*runnerv1.CheckpointRef{
		"another sandbox's CA key": mod(func(e *runnerv1.EgressState) { e.CaKey = other.CAKey }),
		"an evil host's CA": mod(func(e *runnerv1.EgressState) {
			e.CaCert, e.CaKey, e.Injections[0].Host = evil.CACert, evil.CAKey, "evil.example.com"
		}),
		"a host not in the CA": mod(func(e *runnerv1.EgressState) { e.Injections[0].Host = "evil.example.com" }),
		"a value carried":      mod(func(e *runnerv1.EgressState) { e.Injections[0].Placeholder = "the value" }),
		"a huge key":           mod(func(e *runnerv1.EgressState) { e.CaKey = make([]byte, 1<<20) }),
		"10000 injections": mod(func(e *runnerv1.EgressState) {
			for range 10000 {
				e.Injections = append(e.Injections, e.Injections[0])
			}
		}),
		"no state": mod(func(e *runnerv1.EgressState) { *e = runnerv1.EgressState{} }),
		"dropped":  func() *runnerv1.CheckpointRef { r := mod(nil); r.Egress = nil; return r }(),
	} {
		_, err := b.ImportFork(ctx, connect.NewRequest(&runnerv1.ImportForkRequest{Ref: ref, Source: exp.Msg.GetSandbox(),
			Targets: []*runnerv1.ForkTarget{{Id: "fork-x", Meta: map[string]string{runtime.MetaOrg: "org-a"}, EgressSecretValues: map[string]string{"prod/api#token": "v2"}}}}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "ref.egress") {
			t.Errorf("%s: ImportFork = %v", name, err)
		}
	}
	bBackend.mu.Lock()
	n := bBackend.imports
	bBackend.mu.Unlock()
	if n != 0 {
		t.Fatalf("the backend was asked to import %d times", n)
	}
}
