package runnerapi

import (
	"context"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/imagebuild"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// buildingRunner is fakeRunner that builds: it records the request and plays events.
type buildingRunner struct {
	*fakeRunner
	got    runner.BuildRequest
	ctx    string
	events []imagebuild.Event
	res    *runner.BuildResult
	err    error
}

func (b *buildingRunner) Build(_ context.Context, req runner.BuildRequest, emit func(imagebuild.Event)) (*runner.BuildResult, error) {
	b.got = req
	c, _ := io.ReadAll(req.Context)
	b.ctx = string(c)
	for _, ev := range b.events {
		emit(ev)
	}
	return b.res, b.err
}

// TestRunnerapiBuild: a build request crosses the wire whole (options, context,
// credentials, limits), the runner's events arrive in order, then the result.
func TestRunnerapiBuild(t *testing.T) {
	step := imagebuild.Step{Number: 2, Total: 3, Instruction: "RUN make", Cached: true}
	failed := imagebuild.Step{Number: 3, Total: 3, Instruction: "RUN false"}
	b := &buildingRunner{fakeRunner: &fakeRunner{},
		events: []imagebuild.Event{{Step: &step, InStep: 2}, {Stream: imagebuild.Stderr, InStep: 2, Line: "compiling"}, {Stream: imagebuild.System, Line: "pushing"}},
		res:    &runner.BuildResult{Result: &imagebuild.Result{ExitCode: 1, Steps: []imagebuild.Step{step, failed}, Failed: &failed, Why: "exit status 1", Bases: []string{"busybox"}}},
	}
	tr := startBuilding(t, b)
	req := runner.BuildRequest{
		Options: imagebuild.Options{Dockerfile: "sub/Dockerfile", BuildArgs: map[string]string{"A": "1"}, Target: "final", NoCache: true},
		Context: strings.NewReader("archive"), ContextLimits: runtime.ArchiveLimits{MaxBytes: 10, MaxFiles: 2},
		BaseCredentials: &runtime.Credentials{Username: "pull", Password: "p1"}, BaseCredentialsRegistry: "reg.test:5000",
		Push: "reg/org/app:1", PushUsername: "push", PushPassword: "p2", PushInsecure: true,
		Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 1 << 30}, Timeout: time.Minute,
		OrganizationID: "org-1",
	}
	var got []imagebuild.Event
	res, err := tr.client(t).Build(context.Background(), req, func(ev imagebuild.Event) { got = append(got, ev) })
	if err != nil {
		t.Fatal(err)
	}
	g := b.got
	if !reflect.DeepEqual(g.Options, req.Options) || b.ctx != "archive" || g.ContextLimits != req.ContextLimits ||
		*g.BaseCredentials != *req.BaseCredentials || g.BaseCredentialsRegistry != "reg.test:5000" || !g.PushInsecure || g.Push != req.Push || g.PushUsername != "push" || g.PushPassword != "p2" ||
		g.Resources.MilliCPU != 2000 || g.Resources.MemoryBytes != 1<<30 || g.Timeout != time.Minute || g.OrganizationID != "org-1" {
		t.Errorf("the runner got %+v (context %q)", g, b.ctx)
	}
	if !reflect.DeepEqual(got, b.events) {
		t.Errorf("events %+v, want %+v", got, b.events)
	}
	if !reflect.DeepEqual(res.Result, b.res.Result) || res.Digest != "" {
		t.Errorf("result %+v, want %+v", res.Result, b.res.Result)
	}

	// The zero values cross as zero: no credentials, no registry for them, a secure push.
	plain := req
	plain.Context = strings.NewReader("archive")
	plain.BaseCredentials, plain.BaseCredentialsRegistry, plain.PushInsecure = nil, "", false
	if _, err := tr.client(t).Build(context.Background(), plain, nil); err != nil {
		t.Fatal(err)
	}
	if g := b.got; g.BaseCredentials != nil || g.BaseCredentialsRegistry != "" || g.PushInsecure {
		t.Errorf("the runner got credentials %v for %q, push insecure %v; want none", g.BaseCredentials, g.BaseCredentialsRegistry, g.PushInsecure)
	}

	b.err = apierr.New(apierr.BuildNotSupported, "runner r1 builds no images: no builder image", nil)
	if _, err := tr.client(t).Build(context.Background(), req, nil); apierr.Reason(err) != apierr.BuildNotSupported {
		t.Errorf("refused build: %v", err)
	}
}

// A runner whose backend cannot build says so.
func TestRunnerapiBuildUnsupported(t *testing.T) {
	tr := startRunner(t, &fakeRunner{})
	_, err := tr.client(t).Build(context.Background(), runner.BuildRequest{Context: strings.NewReader("x")}, nil)
	if apierr.Reason(err) != apierr.BuildNotSupported {
		t.Errorf("build on a runner without builds: %v", err)
	}
}

// startBuilding is startRunner serving b (a backend that builds).
func startBuilding(t *testing.T, b *buildingRunner) *testRunner {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(b, func(context.Context) (runner.Capacity, error) { return runner.Capacity{}, nil }, nil).HTTPServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testRunner{addr: ln.Addr().String(), ca: ca, fake: b.fakeRunner}
}

// The runner's build capacity crosses the wire.
func TestRunnerapiBuildCapacity(t *testing.T) {
	for _, c := range []runner.Capacity{{BuilderImage: "localhost/builder:1"}, {BuildUnavailable: "it has no builder image"}} {
		got := capacityFromProto(capacityToProto(c))
		if got.BuilderImage != c.BuilderImage || got.BuildUnavailable != c.BuildUnavailable {
			t.Errorf("sent %q/%q, got %q/%q", c.BuilderImage, c.BuildUnavailable, got.BuilderImage, got.BuildUnavailable)
		}
	}
}
