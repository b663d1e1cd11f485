package imagebuild

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeBuilder is an agent that plays a builder: it records what Run hands in and answers
// the build with canned Buildah output and an OCI layout.
type fakeBuilder struct {
	agentv1connect.UnimplementedAgentServiceHandler
	output   []string // chunks of the build's stdout
	exit     int32
	layout   string // host dir served as /build/out
	mu       sync.Mutex
	extracts map[string]int64 // path -> bytes received
	limits   map[string][2]int64
	argv     []string
	files    map[string]string // ReadFile answers
}

func (f *fakeBuilder) ReadFile(_ context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	c, ok := f.files[req.Msg.Path]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New(req.Msg.Path))
	}
	return connect.NewResponse(&agentv1.ReadFileResponse{Content: []byte(c)}), nil
}

func (f *fakeBuilder) Exec(_ context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	return connect.NewResponse(&agentv1.ExecResponse{}), nil
}

func (f *fakeBuilder) ExtractPath(_ context.Context, s *connect.ClientStream[agentv1.ExtractPathRequest]) (*connect.Response[agentv1.ExtractPathResponse], error) {
	var p string
	var n int64
	for s.Receive() {
		if m := s.Msg(); m.Path != "" {
			p = m.Path
			f.mu.Lock()
			f.limits[p] = [2]int64{m.MaxBytes, m.MaxFiles}
			f.mu.Unlock()
		}
		n += int64(len(s.Msg().Data))
	}
	f.mu.Lock()
	f.extracts[p] = n
	f.mu.Unlock()
	return connect.NewResponse(&agentv1.ExtractPathResponse{Stats: &agentv1.ArchiveStats{}}), s.Err()
}

func (f *fakeBuilder) StreamExec(_ context.Context, s *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	m, err := s.Receive()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.argv = m.GetInit().GetCommand()
	f.mu.Unlock()
	for _, c := range f.output {
		if err := s.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Output{Output: &agentv1.Output{Stream: agentv1.Stream_STREAM_STDOUT, Data: []byte(c)}}}); err != nil {
			return err
		}
	}
	return s.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Exit{Exit: &agentv1.Exit{ExitCode: f.exit}}})
}

func (f *fakeBuilder) ArchivePath(ctx context.Context, req *connect.Request[agentv1.ArchivePathRequest], s *connect.ServerStream[agentv1.ArchivePathResponse]) error {
	if req.Msg.Path != dirOut {
		return connect.NewError(connect.CodeNotFound, errors.New(req.Msg.Path))
	}
	root, err := os.Open(f.layout)
	if err != nil {
		return err
	}
	defer root.Close()
	var buf bytes.Buffer
	if _, err := fsarchive.Write(ctx, root, &buf, fsarchive.IDMap{}); err != nil {
		return err
	}
	return s.Send(&agentv1.ArchivePathResponse{Data: buf.Bytes()})
}

func startFake(t *testing.T, f *fakeBuilder) agentv1connect.AgentServiceClient {
	f.extracts, f.limits = map[string]int64{}, map[string][2]int64{}
	_, h := agentv1connect.NewAgentServiceHandler(f)
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return agentv1connect.NewAgentServiceClient(srv.Client(), srv.URL, connect.WithGRPC())
}

// TestRunFlow: Run hands in the context within its limits and each base image, reports
// steps and lines (split across output chunks), and returns the layout's image.
func TestRunFlow(t *testing.T) {
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	f := &fakeBuilder{layout: dir, files: map[string]string{"/build/ctx/Dockerfile": "ARG V\nFROM base$V\nFROM other:1\nCOPY --from=base1 / /\n"}, output: []string{"STEP 1/2: FROM base\nSTEP 2/", "2: RUN make\n--> Using cache 1234\nCOMMIT", " localhost/built:1\n"}}
	c := startFake(t, f)
	var events []Event
	var asked []string
	res, err := Run(context.Background(), c, Input{
		Options: Options{BuildArgs: map[string]string{"V": "1"}},
		Context: strings.NewReader("context-bytes"), ContextLimits: runtime.ArchiveLimits{MaxBytes: 100, MaxFiles: 7},
		WriteBase: func(_ context.Context, ref string, w io.Writer) error {
			asked = append(asked, ref)
			_, err := w.Write([]byte("archive of " + ref))
			return err
		},
		OutDir: t.TempDir() + "/out", OutputLimits: runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100},
		Events: func(ev Event) { events = append(events, ev) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || len(res.Steps) != 2 || !res.Steps[1].Cached || res.Failed != nil {
		t.Errorf("result %+v", res)
	}
	if d, _ := res.Image.Digest(); d != mustDigest(t, img) {
		t.Errorf("image %s, want the layout's %s", d, mustDigest(t, img))
	}
	if strings.Join(asked, ",") != "base1,other:1" || strings.Join(res.Bases, ",") != "base1,other:1" {
		t.Errorf("bases written: %v", asked)
	}
	if f.extracts[dirCtx] != int64(len("context-bytes")) || f.limits[dirCtx] != [2]int64{100, 7} {
		t.Errorf("context: %d bytes with limits %v", f.extracts[dirCtx], f.limits[dirCtx])
	}
	if f.extracts[dirBase] == 0 {
		t.Error("no base images handed in")
	}
	if got := f.argv[len(f.argv)-1]; got != "--build-arg=V=1" {
		t.Errorf("build argv ends %q", got)
	}
	var lines []string
	var steps []int
	for _, ev := range events {
		switch {
		case ev.Step != nil:
			steps = append(steps, ev.Step.Number)
		case ev.Stream == Stdout:
			lines = append(lines, ev.Line)
			if ev.Line == "--> Using cache 1234" && ev.InStep != 2 {
				t.Errorf("the cache line is in step %d, want 2", ev.InStep)
			}
		}
	}
	if len(steps) != 2 || strings.Join(lines, "|") != "STEP 1/2: FROM base|STEP 2/2: RUN make|--> Using cache 1234|COMMIT localhost/built:1" {
		t.Errorf("steps %v, lines %q", steps, lines)
	}
}

// A failing build is a Result naming the step, not an error, and reads no layout.
func TestRunFailedStep(t *testing.T) {
	f := &fakeBuilder{exit: 1, layout: "/nonexistent", files: map[string]string{"/build/ctx/sub/Dockerfile": "FROM scratch\n"}, output: []string{"STEP 1/2: FROM base\nSTEP 2/2: RUN false\nError: building at STEP \"RUN false\": exit status 1\n"}}
	c := startFake(t, f)
	res, err := Run(context.Background(), c, Input{Options: Options{Dockerfile: "./sub/Dockerfile"}, Context: strings.NewReader("x"), OutDir: t.TempDir() + "/out"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 1 || res.Failed == nil || res.Failed.Number != 2 || res.Why != "exit status 1" || res.Image != nil {
		t.Errorf("result %+v (failed %+v)", res, res.Failed)
	}
}

// Run refuses bad options before touching the builder, and bases without a writer.
func TestRunRefuses(t *testing.T) {
	f := &fakeBuilder{}
	c := startFake(t, f)
	if _, err := Run(context.Background(), c, Input{Options: Options{Dockerfile: "../x"}}); err == nil || !strings.Contains(err.Error(), "dockerfile") {
		t.Errorf("bad dockerfile: %v", err)
	}
	if len(f.extracts) != 0 {
		t.Errorf("something was handed in: %v", f.extracts)
	}
	f.files = map[string]string{"/build/ctx/Dockerfile": "FROM x\n"}
	if _, err := Run(context.Background(), c, Input{Context: strings.NewReader("")}); err == nil || !strings.Contains(err.Error(), "WriteBase") {
		t.Errorf("bases without WriteBase: %v", err)
	}
	if _, err := Run(context.Background(), c, Input{Options: Options{Dockerfile: "nope"}, Context: strings.NewReader("")}); err == nil || !strings.Contains(err.Error(), "the Dockerfile nope") {
		t.Errorf("no Dockerfile: %v", err)
	}
	f.files = map[string]string{"/build/ctx/Dockerfile": "RUN x\n"}
	if _, err := Run(context.Background(), c, Input{Context: strings.NewReader("")}); err == nil || !strings.Contains(err.Error(), "no FROM") {
		t.Errorf("a Dockerfile without FROM: %v", err)
	}
	if f.argv != nil {
		t.Errorf("a build ran: %q", f.argv)
	}
}

// A layout larger than OutputLimits is refused while it is read.
func TestRunOutputLimit(t *testing.T) {
	img, err := random.Image(64<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	c := startFake(t, &fakeBuilder{layout: dir, files: map[string]string{"/build/ctx/Dockerfile": "FROM scratch\n"}})
	_, err = Run(context.Background(), c, Input{Context: strings.NewReader("x"), OutDir: t.TempDir() + "/out", OutputLimits: runtime.ArchiveLimits{MaxBytes: 16 << 10}})
	if !errors.Is(err, fsarchive.ErrTooLarge) {
		t.Errorf("an oversized layout: %v", err)
	}
}
